"""Fake trials for the sweep tests that drive the scheduler and the sweeps job directly: each
trial's run is a small Python program (not torchrun) that waits until the test tells it how to
end, and what its rank 0 would write (metric points, checkpoints, its step) the test writes into
the database itself, as tests/unit/test_scheduler.py does for a fake run's first step.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db import metricstore
from db.models import Attempt, Checkpoint, Run, SweepTrial
from db.vocabulary.config import RunConfig
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.scheduler.loop import Scheduler
from orchestrator.sweeps.reconcile import SweepJob
from orchestrator.sweeps.submission import start_sweep, validate_sweep

# Waits for ``end`` in its attempt folder: an exit code to exit with (1: a traceback first, as a
# failing rank prints it, which the scheduler reads as the trial's user error).
PROGRAM = """
import pathlib, sys, time
attempt = pathlib.Path(sys.argv[1])
end = attempt / "end"
while not end.exists():
    time.sleep(0.05)
code = int(end.read_text())
if code == 1:
    log = attempt / "ranks" / "fake_0" / "attempt_0" / "0" / "stderr.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text('Traceback (most recent call last):\\n  File "train.py", line 3, in <module>\\n'
                   'ValueError: the learning rate diverged\\n')
sys.exit(code)
"""


BASE: dict[str, Any] = {"name": "lr", "launch": {"nproc_per_node": 1},
                        "train": {"max_steps": 40, "log_every": 1, "eval_every": 0},
                        "checkpoint": {"every_steps": 10}, "retry": {"max_retries": 0}}


def start(sessions: sessionmaker[Session], slots: int = 2, **sweep: Any) -> int:
    """A RUNNING sweep of BASE over ``train.lr`` (``sweep``: more of its section), for ``slots``."""
    section = {"metric": "loss", "space": {"train.lr": {"log_uniform": [1e-4, 1e-2]}}, **sweep}
    config = validate_sweep({**BASE, "sweep": section}, Inventory(kind="cpu", slots=slots))
    return start_sweep(sessions, config)


def fake_command(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path,
                 **_: object) -> list[str]:
    return [sys.executable, "-c", PROGRAM, str(attempt_dir)]


def machine(sessions: sessionmaker[Session], settings: Settings, slots: int = 2) -> tuple[Scheduler, SweepJob]:
    """A scheduler of fake runs and a sweeps job on ``sessions``, on a CPU machine of ``slots``."""
    inventory = Inventory(kind="cpu", slots=slots)
    return (Scheduler(sessions, settings, inventory, command=fake_command),
            SweepJob(sessions, settings, inventory))


def run_of(sessions: sessionmaker[Session], sweep_id: int, number: int) -> Run:
    with sessions() as s:
        trial = s.scalar(select(SweepTrial).where(SweepTrial.sweep_id == sweep_id, SweepTrial.number == number))
        assert trial is not None and trial.run_id is not None, f"no trial {number}"
        run = s.get(Run, trial.run_id)
        assert run is not None
        s.expunge(run)
        return run


def report(sessions: sessionmaker[Session], run_id: int, step: int, value: float, key: str = "loss",
           checkpoint: bool = True) -> None:
    """What rank 0 writes at ``step``: ``key`` on ranks 0 and 1 (rank 1 a little higher), the
    attempt's step, and a verified checkpoint at that step."""
    with sessions() as s:
        attempt = s.scalar(select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.number.desc()).limit(1))
        assert attempt is not None, f"run {run_id} has no attempt"
        now = time.time()
        metricstore.write_points(s.connection(), [
            {"run_id": run_id, "attempt": attempt.number, "rank": rank, "step": step, "key": key,
             "value": value + rank * 0.1, "wall_time": now} for rank in (0, 1)])
        attempt.last_step, attempt.first_step_at = step, attempt.first_step_at or now
        run = s.get(Run, run_id)
        assert run is not None
        if checkpoint:
            path = Path(run.run_dir) / "checkpoints" / f"step-{step}" / "manifest.json"
            s.add(Checkpoint(run_id=run_id, attempt=attempt.number, step=step, path=str(path), bytes=1, sha256="s",
                             params_digest="p", blocked_s=0.0, total_s=0.1, created_at=now, verified=True))
        s.commit()


def end(sessions: sessionmaker[Session], run_id: int, code: int = 0) -> None:
    """Tell the run's newest attempt to end with ``code``."""
    with sessions() as s:
        attempt = s.scalar(select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.number.desc()).limit(1))
        assert attempt is not None
        # Written whole, then renamed: the program polls for the file and could read it empty
        # (int("") raised, an exit 1 without the traceback: the breaker's test saw UNKNOWN).
        # The attempt's row (STARTING) is committed before the launch makes its folder: a test that
        # ends the attempt as soon as it sees STARTING may come first (CI 3 of 2026-12-02).
        partial = Path(attempt.dir) / "end.partial"
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(str(code))
        partial.rename(Path(attempt.dir) / "end")


def status(sessions: sessionmaker[Session], run_id: int) -> str:
    with sessions() as s:
        run = s.get(Run, run_id)
        assert run is not None
        return run.status


def drive(scheduler: Scheduler, job: SweepJob, done: Callable[[], bool], timeout: float = 30.0) -> None:
    """Pass over the sweeps and tick until ``done``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.run()
        scheduler.tick()
        if done():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def trials(sessions: sessionmaker[Session], sweep_id: int) -> list[dict[str, Any]]:
    """The sweep's trials as plain rows: number, run, params, rung, rungs, objective, promoted."""
    with sessions() as s:
        rows = s.scalars(select(SweepTrial).where(SweepTrial.sweep_id == sweep_id).order_by(SweepTrial.number))
        return [{"number": r.number, "run_id": r.run_id, "params": json.loads(r.params_json), "rung": r.rung,
                 "rungs": json.loads(r.rungs_json), "objective": r.objective, "promoted": r.promoted,
                 "history": r.history_json, "prune": json.loads(r.prune_json) if r.prune_json else None}
                for r in rows]
