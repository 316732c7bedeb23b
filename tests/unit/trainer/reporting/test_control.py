"""trainer/reporting/control.py: the ranks' one control collective per step, read a step after it was sent.

Two real gloo ranks (processes) play a scripted loop: what every rank is told at every step is
what a training loop acts on (stop, save), so both ranks must be told the same thing at the
same step, one step after a rank raised a flag, and the metrics of every log step must reach
rank 0 exactly once, the last ones at close(). Then the same through the SDK's Run, which makes
one channel and hands it to the stop signal, the checkpointer and the monitor: their flags and
metrics share one agreement per step.
"""

from __future__ import annotations

import functools
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from db.vocabulary.config import CheckpointConfig, SupervisionConfig
from tests.conftest import fork_ranks
from trainer.context import RunContext
from trainer.reporting.control import ControlChannel
from trainer.sdk import Run

STEPS = 8
LOG_STEPS = {2, 4, 5, 8}


def play(rank: int, store_path: str, out: str) -> None:
    """One rank's loop: log at LOG_STEPS, agree at every step's end; rank 1 gets "SIGTERM" during
    step 3 and a time-based save falls due on rank 0 only during step 6 (a flag added at step 5)."""
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    state = {"stop": False, "late": False}
    channel = ControlChannel()
    channel.add_flag("stop", lambda: state["stop"])

    told: dict[int, dict[str, bool]] = {}
    received: list[list[Any]] = []

    def record(step: int, table: list[list[float]]) -> None:
        """Rank 0's table of the values sent at ``step``, and the steps told so far when it came."""
        received.append([step, table, sorted(told)])

    try:
        for step in range(1, STEPS + 1):
            if rank == 1 and step == 3:
                state["stop"] = True
            if step == 5:
                channel.add_flag("late", lambda: state["late"])
            state["late"] = rank == 0 and step == 6
            if step in LOG_STEPS:
                channel.gather([float(step), 100.0 * rank + step], functools.partial(record, step))
            told[step] = channel.agree()
        channel.close()
    finally:
        dist.destroy_process_group()
    Path(out).write_text(json.dumps({"told": told, "received": received}))


def test_two_ranks_are_told_the_same_one_step_late_and_every_log_arrives_once(tmp_path: Path) -> None:
    outs = [tmp_path / f"rank-{r}.json" for r in range(2)]
    fork_ranks(_entry, (str(tmp_path / "store"), [str(o) for o in outs]), 2)
    results = [json.loads(o.read_text()) for o in outs]
    assert results[0]["told"] == results[1]["told"]  # the same decisions at the same steps
    told = results[0]["told"]
    # Raised in step 3, heard in step 4, and kept.
    assert [s for s in told if told[s]["stop"]] == [str(s) for s in range(4, STEPS + 1)]
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
    got: list[list[list[float]]] = []
    channel.gather([1.0, 2.0], got.append)
    assert got == [[[1.0, 2.0]]]  # at once, this rank's row alone
    assert channel.agree() == {"stop": False}
    flag["on"] = True
    assert channel.agree() == {"stop": True}  # read now: no other rank to wait for
    channel.close()


# -- one channel per process, handed around ------------------------------------------------------


def play_run(rank: int, store_path: str, run_dir: str, out: str) -> None:
    """One rank of a loop on the SDK's real Run: rank 1 gets SIGTERM during step 3; the loop logs
    every step and asks both should_stop() and checkpoint_due() once per step."""
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    ctx = RunContext(run_id=None, attempt=1, db_url=None, run_dir=Path(run_dir), attempt_dir=Path(run_dir) / "a1")
    run = Run(ctx, CheckpointConfig(every_steps=2, every_seconds=3600, keep_last=0), SupervisionConfig())
    agreements = []
    agree = run.channel.agree

    def counted() -> dict[str, bool]:
        agreements.append(step)
        return agree()

    run.channel.agree = counted  # type: ignore[method-assign]
    saved, step = [], 0
    try:
        for step in range(1, STEPS + 1):
            if rank == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # caught by the Run's stop signal
            run.log(step, loss=float(step))
            stopping = run.should_stop()
            if stopping or run.checkpoint_due(step):
                run.save_checkpoint(step, {"model": {"w": torch.full((2,), float(step))}})
                saved.append(step)
            if stopping:
                break
        run.finish()
    finally:
        dist.destroy_process_group()
    Path(out).write_text(json.dumps({"stopped_at": step, "saved": saved, "agreements": agreements,
                                     "flags": list(run.channel._names)}))


def test_the_run_hands_one_channel_to_the_stop_signal_the_checkpointer_and_the_monitor(tmp_path: Path) -> None:
    outs = [tmp_path / f"rank-{r}.json" for r in range(2)]
    fork_ranks(_run_entry, (str(tmp_path / "store"), str(tmp_path / "run"), [str(o) for o in outs]), 2)
    results = [json.loads(o.read_text()) for o in outs]
    for result in results:
        assert result["flags"] == ["stop", "checkpoint_due"]  # the stop signal's and the checkpointer's, one channel
        assert result["stopped_at"] == 4  # raised in 3, heard by both in 4
        assert result["saved"] == [2, 4]  # every 2 steps; the stop's save is step 4's
        assert result["agreements"] == [1, 2, 3, 4]  # should_stop() and checkpoint_due() share one per step
    stopped = json.loads((tmp_path / "run" / "a1" / "stopped.json").read_text())
    assert stopped["step"] == 4 and stopped["checkpoint_step"] == 4


def _run_entry(rank: int, store_path: str, run_dir: str, outs: list[str]) -> None:
    play_run(rank, store_path, run_dir, outs[rank])
