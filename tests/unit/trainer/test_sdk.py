"""The Workload protocol on the SDK's real ``Run``, in this one process, without torchrun.

A tiny workload written against the protocol trains, saves on the ``[checkpoint]`` schedule,
stops on SIGTERM with a checkpoint and a note, and resumes bit for bit (its batches come from the
global RNG, so the RNG states must come back too); a managed run records its checkpoints in the
database and leaves the finished note only once they are durable. The built-in mlp-digits runs
through ``python -m trainer``'s ``main`` on a one-rank process group, and a resume from an older
step moves the newer checkpoints aside. A rank's process start, the end of its launch phase, is
read to the clock's tick.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker
from torch import nn

from db.models import Checkpoint
from db.vocabulary.config import RunConfig, parse_config
from db.vocabulary.layout import MANIFEST_FILE
from db.vocabulary.settings import Settings
from tests.unit.paths import ROOT
from trainer.__main__ import main
from trainer.checkpoint import CheckpointManager
from trainer.context import RunContext
from trainer.process import pdeathsig
from trainer.sdk import Run
from trainer.workloads import Workload, build_workload
from trainer.workloads.mlp_digits import MLPDigits

MAX_STEPS = 12


class Tiny:
    """A linear regression on random batches, written against :class:`Workload`."""

    def __init__(self, config: RunConfig, sigterm_at: int | None = None) -> None:
        self.config = config
        self.sigterm_at = sigterm_at
        self.losses: dict[int, float] = {}

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "data": self.data}

    def setup(self, run: Run) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.data = {"seen": 0}  # plain numbers travel in a dict
        self.step = run.load_checkpoint(self.state())

    def train(self, run: Run) -> dict[str, float]:
        step = self.step
        while step < MAX_STEPS:
            x = torch.randn(8, 4)  # the global RNG: a resume must restore it to repeat the batches
            loss = (self.model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            run.before_update()
            self.optimizer.step()
            step += 1
            self.data["seen"] += len(x)
            self.losses[step] = loss.item()
            if step == self.sigterm_at:
                os.kill(os.getpid(), signal.SIGTERM)  # the Run's handler: outside a group it is heard at once
            run.log(step, loss=loss.detach())
            stopping = run.should_stop()
            if stopping or run.checkpoint_due(step, last=step == MAX_STEPS):
                run.save_checkpoint(step, self.state(), metrics={"loss": loss.detach()}, defer_snapshot=True)
            if stopping:
                break
        return {"step": step}


def drive(workload: Workload, run: Run) -> dict[str, float]:
    """What ``python -m trainer`` does with a workload."""
    try:
        workload.setup(run)
        summary = workload.train(run)
    except BaseException:
        run.close()
        raise
    run.finish()
    return summary


@pytest.fixture(autouse=True)
def _one_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No torchrun here; the Run's SIGTERM handler and stack dumps are undone afterwards."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RUNYARD_RUN_DIR", "RUNYARD_RUN_ID", "RUNYARD_DB_URL",
                 "RUNYARD_ATTEMPT", "RUNYARD_ATTEMPT_DIR", "RUNYARD_RESUME_DIR", "RUNYARD_RESUME_STEP"):
        monkeypatch.delenv(name, raising=False)
    sigterm = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, sigterm)
    faulthandler.unregister(signal.SIGUSR1)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def context(run_dir: Path, attempt: int = 1, resume_step: int | None = None, settings: Settings | None = None
            ) -> RunContext:
    return RunContext(run_id=1 if settings else None, attempt=attempt, db_url=settings.db_url if settings else None,
                      run_dir=run_dir, attempt_dir=run_dir / "attempts" / str(attempt),
                      resume_dir=run_dir / "checkpoints" if resume_step else None, resume_step=resume_step)


def tiny_run(ctx: RunContext) -> Run:
    config = parse_config({"name": "tiny", "checkpoint": {"every_steps": 5, "keep_last": 0}})
    return Run(ctx, config.checkpoint, config.supervision, config=config)


def digest(folder: Path) -> str:
    return json.loads((folder / MANIFEST_FILE).read_text())["params_digest"]


def test_a_workload_runs_on_one_process_and_resumes_bit_for_bit(tmp_path: Path) -> None:
    first = Tiny(parse_config({"name": "tiny"}))
    assert drive(first, tiny_run(context(tmp_path))) == {"step": MAX_STEPS}
    checkpoints = CheckpointManager(tmp_path / "checkpoints", is_writer=False)
    assert checkpoints.verified_steps() == [5, 10, 12]  # every 5 steps, and the last
    _step, saved = checkpoints.load(5)
    assert saved["data"] == {"seen": 40} and len(saved["rng"]) == 1 and saved["world_size"] == 1

    again = Tiny(parse_config({"name": "tiny"}))
    assert drive(again, tiny_run(context(tmp_path, attempt=2, resume_step=5))) == {"step": MAX_STEPS}
    assert again.step == 5 and again.data == {"seen": 8 * MAX_STEPS}
    assert again.losses == {s: loss for s, loss in first.losses.items() if s > 5}  # the same batches, bit for bit
    superseded = tmp_path / "checkpoints" / "superseded" / "attempt-2"
    assert sorted(p.name for p in superseded.iterdir()) == ["step-10", "step-12"]  # moved aside, not overwritten
    assert digest(superseded / "step-12") == digest(tmp_path / "checkpoints" / "step-12")


def test_sigterm_stops_with_a_checkpoint_and_a_note(tmp_path: Path) -> None:
    workload = Tiny(parse_config({"name": "tiny"}), sigterm_at=7)
    assert drive(workload, tiny_run(context(tmp_path))) == {"step": 7}
    assert CheckpointManager(tmp_path / "checkpoints", is_writer=False).verified_steps() == [5, 7]
    stopped = json.loads((tmp_path / "attempts" / "1" / "stopped.json").read_text())
    assert stopped["step"] == 7 and stopped["checkpoint_step"] == 7 and stopped["received_at"]
    assert not (tmp_path / "attempts" / "1" / "finished").exists()  # unmanaged: nobody reads it


def test_a_managed_run_records_its_checkpoints_and_then_leaves_the_finished_note(
    tmp_path: Path, settings: Settings, sessions: sessionmaker[Session]
) -> None:
    run_dir = tmp_path / "run"
    drive(Tiny(parse_config({"name": "tiny"})), tiny_run(context(run_dir, settings=settings)))
    note = json.loads((run_dir / "attempts" / "1" / "finished" / "rank-0.json").read_text())
    assert note["rank"] == 0 and note["step"] == MAX_STEPS
    with sessions() as s:
        rows = s.scalars(select(Checkpoint).order_by(Checkpoint.step)).all()
    assert [(r.step, r.verified) for r in rows] == [(5, True), (10, True), (12, True)]
    assert all(json.loads(r.metrics_json)["loss"] >= 0 for r in rows)


def test_a_failing_workload_closes_the_run_without_notes(tmp_path: Path) -> None:
    class Failing(Tiny):
        def train(self, run: Run) -> dict[str, float]:
            run.save_checkpoint(1, self.state())
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        drive(Failing(parse_config({"name": "tiny"})), tiny_run(context(tmp_path)))
    assert CheckpointManager(tmp_path / "checkpoints", is_writer=False).verified_steps() == [1]  # durable
    assert not (tmp_path / "attempts" / "1" / "stopped.json").exists()


def test_the_time_based_save_is_agreed_on_the_channel(tmp_path: Path) -> None:
    config = parse_config({"name": "tiny", "checkpoint": {"every_steps": 0, "every_seconds": 3600}})
    run = Run(context(tmp_path), config.checkpoint, config.supervision, config=config)
    assert [run.checkpoint_due(step) for step in (1, 2)] == [False, False]
    run._checkpoints._last_save -= 3600  # an hour passed on this rank's clock
    assert run.checkpoint_due(3) and not run.should_stop()
    run.finish()


def test_should_stop_gives_one_answer_per_step_so_the_readme_pattern_saves_the_stop_step(tmp_path: Path) -> None:
    """docs/SCRIPTS.md's loop asks should_stop() twice a step: ``if step % 100 == 0 or should_stop(): save``
    then ``if should_stop(): break``. A SIGTERM heard between the two calls must not make the
    second one true (it would break without the save); the next step answers true twice."""
    run = tiny_run(context(tmp_path))
    calls: list[tuple[int, bool, bool]] = []
    saved: list[int] = []
    for step in range(1, 20):
        run.log(step, loss=1.0)
        first = run.should_stop()
        if step % 100 == 0 or first:
            run.save_checkpoint(step, {"model": {"w": torch.zeros(2)}})
            saved.append(step)
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # outside a group it is heard at the next agreement
        second = run.should_stop()
        calls.append((step, first, second))
        if second:
            break
    run.finish()
    assert calls[-2:] == [(4, False, False), (5, True, True)] and saved == [5]
    assert CheckpointManager(tmp_path / "checkpoints", is_writer=False).verified_steps() == [5]


def test_each_step_moves_the_progress_mark_once_whichever_call_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's heartbeat and ETA follow the progress mark: a step logged, or only asked
    about (a loop that logs every N steps), moves it once; an epoch-local step that goes back
    moves it too."""
    run = tiny_run(context(tmp_path))
    marks: list[int] = []
    monkeypatch.setattr(run.reporter, "progress", marks.append)
    run.log(1, loss=1.0)
    run.should_stop(1)
    run.checkpoint_due(1)
    run.checkpoint_due(2)  # no log at step 2
    run.should_stop()
    run.log(1, loss=0.5)  # a new epoch's step 1
    run.finish()
    assert marks == [1, 2, 1]


def test_without_step_reports_each_should_stop_call_asks_anew(tmp_path: Path) -> None:
    run = tiny_run(context(tmp_path))
    assert not run.should_stop()
    os.kill(os.getpid(), signal.SIGTERM)
    assert run.should_stop()  # no step was ever reported: the call cannot be placed in a step
    run.finish()


def test_a_metric_of_rank_0_alone_is_written_for_rank_0_without_taking_a_step(
    tmp_path: Path, settings: Settings, sessions: sessionmaker[Session]
) -> None:
    run = tiny_run(context(tmp_path / "run", settings=settings))
    run.log(1, loss=2.0)
    run.log_rank0(2, eval_loss=torch.tensor(1.5))  # nanoGPT's evaluation, under `if rank == 0:`
    assert not run.should_stop() and run._read_at["stop"] == 1  # not a step report: ranks stay in step
    run.finish()
    with sessions() as s:
        rows = s.execute(text("SELECT rank, step, key, value FROM metrics WHERE key = 'eval_loss'")).all()
    assert [tuple(r) for r in rows] == [(0, 2, "eval_loss", 1.5)]


def test_build_workload_picks_the_kind_and_refuses_unknown_ones() -> None:
    assert isinstance(build_workload(parse_config({"name": "a"})), MLPDigits)
    script = parse_config({"name": "s", "workload": {"kind": "script", "script": "train.py"}})
    with pytest.raises(ValueError, match="'script' is not a built-in workload"):
        build_workload(script)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_mlp_digits_runs_through_the_entry_point_on_one_rank_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The parent here is pytest, not a torchrun agent of this attempt: nothing to die with.
    monkeypatch.setattr(pdeathsig, "arm_under_agent", lambda: False)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"name": "one", "train": {"max_steps": 30, "log_every": 5, "eval_every": 0,
                                                            "deterministic": True},
                                  "checkpoint": {"every_steps": 10, "keep_last": 0}}))
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "RUNYARD_RUN_DIR": str(tmp_path), "RUNYARD_ATTEMPT": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    assert main(["--config", str(config)]) == 0
    root = tmp_path / "checkpoints"
    assert CheckpointManager(root, is_writer=False).verified_steps() == [10, 20, 30]
    first = digest(root / "step-30")

    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("RUNYARD_ATTEMPT", "2")
    monkeypatch.setenv("RUNYARD_RESUME_DIR", str(root))
    monkeypatch.setenv("RUNYARD_RESUME_STEP", "10")
    assert main(["--config", str(config)]) == 0
    assert digest(root / "step-30") == first  # the data position and RNG states came back
    assert sorted(p.name for p in (root / "superseded" / "attempt-2").iterdir()) == ["step-20", "step-30"]


def test_a_process_start_is_read_to_the_tick_not_to_the_boot_second() -> None:
    """The ``spawned`` mark (the end of the launch phase) is when the rank's process was created:
    never before the parent started it, never after the child's first line ran. psutil's
    create_time can be up to a second early (the boot time it adds is in whole seconds)."""
    code = "import time; t = time.time(); from trainer.sdk import process_started; print(t, process_started())"
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         cwd=ROOT).stdout
    first_line, started = (float(x) for x in out.split())
    assert before - 0.02 <= started <= first_line  # one clock tick (10 ms) of rounding, no more
