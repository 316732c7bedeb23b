"""No process lost track of, without torchrun: the loop adopts a launch from its record, sweeps a
run's processes by their environment before it settles an attempt or starts the next, holds an
attempt a process outlives SIGKILL in, and a cancel reaches every attempt of the run.

The "attempts" here are small Python programs under the real shim (launched through
``Scheduler(command=...)``), and their "orphans" are real processes in sessions of their own
that carry the attempt's environment, as torchrun's ranks do.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Event, Run, RunStatusHistory
from db.requests import request_cancel
from db.states import AttemptStatus
from db.vocabulary.config import RunConfig
from db.vocabulary.settings import Settings
from orchestrator.executors import sweeper as sweeper_module
from orchestrator.executors.processes import Sweep, read_launch_record
from orchestrator.scheduler.loop import LAUNCH_LOST_S, Scheduler
from tests.unit.orchestrator.fake_runs import CPU2, attempts, dead, queue, status, stray, tick_until

# Attempt N of a run named NAME does what BEHAVIOUR[NAME][N - 1] says (the last entry for later
# attempts): "sleep" (60 s), "fail" (exit 3), or "orphan-fail" (leave a process in a session of
# its own that keeps sleeping, then exit 3, like ranks that outlive a killed torchrun agent).
PROGRAM = textwrap.dedent("""
    import os, subprocess, sys, time
    what = sys.argv[1]
    if what == "orphan-fail":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        with open("orphan.pid", "w") as f:
            f.write(str(child.pid))
        sys.exit(3)
    if what == "fail":
        sys.exit(3)
    print("ready", flush=True)
    time.sleep(60)
""")

BEHAVIOUR = {"sleeper": ["sleep"], "orphaner": ["orphan-fail", "sleep"], "fail-then-sleep": ["fail", "sleep"]}


def command(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path, **_: object) -> list[str]:
    steps = BEHAVIOUR[config.name]
    return [sys.executable, "-c", PROGRAM, steps[min(attempt, len(steps)) - 1]]


def scheduler_for(sessions: sessionmaker[Session], settings: Settings) -> Scheduler:
    return Scheduler(sessions, settings, CPU2, command=command)


def run_dir_of(sessions: sessionmaker[Session], run_id: int) -> str:
    with sessions() as s:
        return s.get_one(Run, run_id).run_dir


def events(sessions: sessionmaker[Session], run_id: int) -> list[str]:
    with sessions() as s:
        return list(s.scalars(select(Event.message).where(Event.run_id == run_id).order_by(Event.id)))


# -- adoption ----------------------------------------------------------------------------------


def forget_pid(sessions: sessionmaker[Session], run_id: int, age_s: float) -> None:
    """What a scheduler that died between launch() and the commit leaves: pid IS NULL."""
    with sessions() as s:
        s.execute(update(Attempt).where(Attempt.run_id == run_id)
                  .values(pid=None, pid_create_time=None, started_at=time.time() - age_s))
        s.commit()


def test_a_launch_without_a_committed_pid_is_adopted_from_the_record(sessions: sessionmaker[Session],
                                                                      settings: Settings) -> None:
    run_id = queue(sessions, settings, "sleeper")
    first = scheduler_for(sessions, settings)
    first.tick()
    (attempt,) = attempts(sessions, run_id)
    shim_pid = attempt.pid

    def recorded() -> bool:
        record = read_launch_record(Path(attempt.dir))
        return record is not None and record["torchrun_pid"] is not None

    tick_until(first, recorded)
    forget_pid(sessions, run_id, age_s=LAUNCH_LOST_S + 10)  # long past the old "lost launch" limit
    second = scheduler_for(sessions, settings)
    for _ in range(3):
        second.tick()
    (attempt,) = attempts(sessions, run_id)
    assert attempt.status == AttemptStatus.RUNNING.value and status(sessions, run_id) == "STARTING"
    assert attempt.pid == shim_pid and psutil.Process(shim_pid).is_running()
    assert any(f"adopted pid {shim_pid} from" in m for m in events(sessions, run_id))


def test_a_lost_launch_without_a_record_is_swept_before_it_is_called_vanished(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    run_id = queue(sessions, settings, "sleeper", retry={"max_retries": 0})
    scheduler = scheduler_for(sessions, settings)
    scheduler.tick()
    (attempt,) = attempts(sessions, run_id)
    shim = psutil.Process(attempt.pid)
    tick_until(scheduler, lambda: len(shim.children()) == 1)
    (program,) = shim.children()
    rank = stray(attempt.dir.rsplit("/attempts/", 1)[0], 1)  # like a rank: out of the shim's tree
    shim.kill()  # the shim is gone and left no record
    shim.wait(5)
    (Path(attempt.dir) / "launch.json").unlink()
    forget_pid(sessions, run_id, age_s=LAUNCH_LOST_S + 10)
    tick_until(scheduler, lambda: status(sessions, run_id) == "FAILED")
    assert dead(program.pid)  # the shim's child died with it (PR_SET_PDEATHSIG)
    assert rank.wait(5) == -signal.SIGKILL  # found by its environment, killed before the attempt was settled
    (attempt,) = attempts(sessions, run_id)
    assert attempt.cause == "VANISHED"


# -- the sweep ---------------------------------------------------------------------------------


def test_an_orphan_of_a_failed_attempt_is_killed_before_it_is_settled_and_retried(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    run_id = queue(sessions, settings, "orphaner", retry={"max_retries": 1, "backoff_s": 0.1})
    scheduler = scheduler_for(sessions, settings)
    pid_file = Path(run_dir_of(sessions, run_id)) / "orphan.pid"
    tick_until(scheduler, lambda: pid_file.exists() and pid_file.read_text() != "")
    orphan = int(pid_file.read_text())
    # Settled, then retried: under load one tick can do both (the settle outlasts the 0.1 s
    # backoff), so the run is never seen RETRYING between ticks; its history says it was.
    tick_until(scheduler, lambda: attempts(sessions, run_id)[0].status != "RUNNING")
    assert dead(orphan)  # settled only once it was gone
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)
    assert [a.exit_code for a in attempts(sessions, run_id)][:1] == [3]
    with sessions() as s:
        moves = s.scalars(select(RunStatusHistory.to_status).where(RunStatusHistory.run_id == run_id)
                          .order_by(RunStatusHistory.id)).all()
    assert moves == ["QUEUED", "STARTING", "RETRYING", "STARTING"]


def test_a_stray_of_an_earlier_attempt_dies_before_the_next_attempt_starts(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    run_id = queue(sessions, settings, "fail-then-sleep", retry={"max_retries": 1, "backoff_s": 2})
    scheduler = scheduler_for(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, run_id) == "RETRYING")
    left = stray(run_dir_of(sessions, run_id), 1)  # appears during the backoff
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)
    left.wait(5)
    assert left.returncode == -signal.SIGKILL


def test_a_process_that_outlives_sigkill_holds_the_attempt(
    sessions: sessionmaker[Session], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process stuck in the kernel (state D) ignores SIGKILL until it leaves it; none can be made
    here, so the sweep's answer is faked for a few ticks."""
    run_id = queue(sessions, settings, "fail-then-sleep", retry={"max_retries": 1, "backoff_s": 0.1})
    scheduler = scheduler_for(sessions, settings)
    stuck = Sweep(killed=1, survivors=["pid 4242 (python -m trainer, disk-sleep)"])
    monkeypatch.setattr(sweeper_module, "end_processes", lambda *a, **k: stuck)
    scheduler.tick()
    (attempt,) = attempts(sessions, run_id)
    deadline = time.monotonic() + 10
    while not (Path(attempt.dir) / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(5):
        scheduler.tick()
    (attempt,) = attempts(sessions, run_id)
    assert attempt.status == "RUNNING" and status(sessions, run_id) == "STARTING"  # exited, not settled
    warnings = [m for m in events(sessions, run_id) if "still alive" in m]
    assert len(warnings) == 1 and "pid 4242 (python -m trainer, disk-sleep)" in warnings[0]
    monkeypatch.setattr(sweeper_module, "end_processes", lambda *a, **k: Sweep(killed=0, survivors=[]))
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)


def test_cancel_reaches_every_attempt_of_the_run(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = queue(sessions, settings, "fail-then-sleep", retry={"max_retries": 1, "backoff_s": 0.1})
    scheduler = scheduler_for(sessions, settings)
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)
    old = stray(run_dir_of(sessions, run_id), 1)  # attempt 1's, somehow still alive
    with sessions() as s:
        request_cancel(s, run_id)
        s.commit()
    scheduler.tick()
    old.wait(5)
    assert old.returncode == -signal.SIGKILL
    tick_until(scheduler, lambda: status(sessions, run_id) == "CANCELLED")
