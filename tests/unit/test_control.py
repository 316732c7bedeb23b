"""trainer/control.py: the ranks' one control collective per step, read a step after it was sent.

Two real gloo ranks (processes) play a scripted loop: what every rank is told at every step is
what a training loop acts on (stop, save), so both ranks must be told the same thing at the
same step, one step after a rank raised a flag, and the metrics of every log step must reach
rank 0 exactly once, the last ones at close().
"""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.control import ControlChannel

STEPS = 8
LOG_STEPS = {2, 4, 5, 8}


def play(rank: int, store_path: str, out: str) -> None:
    """One rank's loop: log at LOG_STEPS, agree at every step's end; rank 1 gets "SIGTERM" during
    step 3 and a time-based save falls due on rank 0 only during step 6 (a flag added at step 5)."""
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    state = {"stop": False, "late": False}
    channel = ControlChannel()
    channel.add_flag("stop", lambda: state["stop"])
    told, received = {}, []
    try:
        for step in range(1, STEPS + 1):
            if rank == 1 and step == 3:
                state["stop"] = True
            if step == 5:
                channel.add_flag("late", lambda: state["late"])
            state["late"] = rank == 0 and step == 6
            if step in LOG_STEPS:
                channel.gather([float(step), 100.0 * rank + step],
                               lambda table, step=step: received.append([step, table, sorted(told)]))
            told[step] = channel.agree()
        channel.close()
    finally:
        dist.destroy_process_group()
    Path(out).write_text(json.dumps({"told": told, "received": received}))


def test_two_ranks_are_told_the_same_one_step_late_and_every_log_arrives_once(tmp_path: Path) -> None:
    outs = [tmp_path / f"rank-{r}.json" for r in range(2)]
    mp.start_processes(_entry, args=(str(tmp_path / "store"), [str(o) for o in outs]), nprocs=2,
                       start_method="spawn")
    results = [json.loads(o.read_text()) for o in outs]
    assert results[0]["told"] == results[1]["told"]  # the same decisions at the same steps
    told = results[0]["told"]
    assert [s for s in told if told[s]["stop"]] == [str(s) for s in range(4, STEPS + 1)]  # raised in 3, heard in 4, kept
    assert [s for s in told if told[s].get("late")] == ["7"]  # due on rank 0 in 6, heard by both in 7
    assert "late" not in told["4"] and told["5"] == {"stop": True, "late": False}

    for result in results:
        # Every log's values arrive once, from both ranks, in order; each during a later step
        # (after that step's decisions were handed out), the last at close().
        assert [r[0] for r in result["received"]] == sorted(LOG_STEPS)
        for step, table, told_before in result["received"]:
            assert table == [[step, step], [step, 100.0 + step]]
            assert step in told_before
        assert result["received"][-1][2] == list(range(1, STEPS + 1))  # close()


def _entry(rank: int, store_path: str, outs: list[str]) -> None:
    play(rank, store_path, outs[rank])


def test_outside_a_process_group_everything_is_local() -> None:
    flag = {"on": False}
    channel = ControlChannel()
    channel.add_flag("stop", lambda: flag["on"])
    got = []
    channel.gather([1.0, 2.0], got.append)
    assert got == [[[1.0, 2.0]]]  # at once, this rank's row alone
    assert channel.agree() == {"stop": False}
    flag["on"] = True
    assert channel.agree() == {"stop": True}  # read now: no other rank to wait for
    channel.close()
