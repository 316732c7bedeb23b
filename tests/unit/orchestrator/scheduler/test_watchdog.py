"""The hang watchdog's threshold on a real SQLite database: max(hang_timeout_s, hang_step_factor
x p95 step time). No process is involved: the attempt has no pid, so the stacks dump finds
nothing to signal; what is checked is when a hang is declared, and the event that says so."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.metricstore import write_points
from db.models import Attempt, Event, Run
from db.requests import create_run
from db.states import AttemptStatus
from db.vocabulary.config import RunConfig, SupervisionConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.executors.local import LocalExecutor
from orchestrator.executors.stack_reading import RankStack
from orchestrator.executors.stacks import StackDump, StackDumps
from orchestrator.scheduler import watchdog
from orchestrator.scripts.attempt_watch import WATCH_STEPS_OR_OUTPUT


def running_attempt(sessions: sessionmaker[Session], settings: Settings, step_time_s: float) -> tuple[int, int]:
    """A run whose attempt 1 reported 20 steps of ``step_time_s`` each (rank 0)."""
    with sessions() as s:
        run = create_run(s, RunConfig.model_validate({"name": "hang"}), settings.runs_dir,
                         Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.flush()
        attempt = Attempt(run_id=run.id, number=1, status=AttemptStatus.RUNNING.value,
                          dir=f"{run.run_dir}/attempts/1", started_at=0.0, first_step_at=1.0, last_step=20)
        s.add(attempt)
        s.flush()
        write_points(s.connection(), [
            {"run_id": run.id, "attempt": 1, "rank": 0, "step": step, "key": "step_time", "value": step_time_s,
             "wall_time": float(step)} for step in range(1, 21)
        ])
        s.commit()
        return run.id, attempt.id


def check_at(sessions: sessionmaker[Session], ids: tuple[int, int], config: SupervisionConfig,
             silent_s: float) -> Attempt:
    run_id, attempt_id = ids
    with sessions() as s:
        attempt, run = s.get_one(Attempt, attempt_id), s.get_one(Run, run_id)
        now = time.time()
        attempt.progress_at = now - silent_s
        dumps = StackDumps()
        watchdog.check(s, run, attempt, config, script=False, dumps=dumps, executor=LocalExecutor(), now=now)
        dumps.close()
        s.commit()
        return attempt


def test_slow_steps_raise_the_hang_threshold(sessions: sessionmaker[Session], settings: Settings) -> None:
    config = SupervisionConfig(hang_timeout_s=10, hang_step_factor=5)
    ids = running_attempt(sessions, settings, step_time_s=6.0)  # p95 6 s: threshold 5 x 6 = 30 s
    assert check_at(sessions, ids, config, silent_s=8).hang_detected_at is None  # under hang_timeout_s
    assert check_at(sessions, ids, config, silent_s=25).hang_detected_at is None  # over it, under 30 s
    attempt = check_at(sessions, ids, config, silent_s=35)
    assert attempt.hang_detected_at is not None and attempt.stop_reason == "hang"
    with sessions() as s:
        (message,) = s.scalars(select(Event.message).where(Event.kind == "hang")).all()
    assert "no step completed for 35 s (threshold 30 s) after step 20" in message


def test_fast_steps_leave_hang_timeout_s_as_the_threshold(sessions: sessionmaker[Session], settings: Settings) -> None:
    config = SupervisionConfig(hang_timeout_s=10, hang_step_factor=5)
    ids = running_attempt(sessions, settings, step_time_s=0.05)
    assert check_at(sessions, ids, config, silent_s=9).hang_detected_at is None
    assert check_at(sessions, ids, config, silent_s=11).hang_detected_at is not None


def test_an_attempt_that_ends_during_its_hang_dump_keeps_the_evidence(sessions: sessionmaker[Session],
                                                                      settings: Settings, tmp_path: Path) -> None:
    # Seen in CI: a rank stopped with SIGSTOP and woken for its stacks died of SIGSEGV, and the
    # attempt ended on its own while py-spy still ran; its dump was thrown away with the attempt.
    release = threading.Event()

    def slow_dump() -> StackDump:
        release.wait(10)
        return StackDump(folder=tmp_path, files=[], ranks=[RankStack(0, 10, False, "x"), RankStack(1, 11, True, "y")])

    run_id, attempt_id = running_attempt(sessions, settings, step_time_s=0.1)
    dumps = StackDumps()
    try:
        with sessions() as s:
            run, attempt = s.get_one(Run, run_id), s.get_one(Attempt, attempt_id)
            attempt.hang_detected_at = time.time()
            dumps.start(watchdog.hang_key(run_id, 1), slow_dump)
            assert not watchdog.hang_evidence_kept(s, run, attempt, dumps)  # not settled while the dump runs
            release.set()
            deadline = time.monotonic() + 10
            while not watchdog.hang_evidence_kept(s, run, attempt, dumps) and time.monotonic() < deadline:
                time.sleep(0.05)
            s.commit()
            (message,) = s.scalars(select(Event.message).where(Event.kind == "stacks")).all()
            assert attempt.failed_rank == 1 and "the attempt had ended meanwhile" in message
            assert "rank 1 was stopped" in message
    finally:
        dumps.close()


def test_a_script_that_steps_once_an_epoch_but_prints_meanwhile_is_alive(sessions: sessionmaker[Session],
                                                                         settings: Settings) -> None:
    """A step every ~30 s, a printed line every 10 s, hang_timeout_s = 20: its output is life,
    said once; once the output stops too, it is a hang."""
    config = SupervisionConfig(hang_timeout_s=20, hang_step_factor=5)
    ids = running_attempt(sessions, settings, step_time_s=0.05)

    def check(silent_s: float, printed_s: float) -> Attempt:
        with sessions() as s:
            attempt, run = s.get_one(Attempt, ids[1]), s.get_one(Run, ids[0])
            now = time.time()
            attempt.progress_at = now - silent_s
            dumps = StackDumps()
            watchdog.check(s, run, attempt, config, script=True, dumps=dumps, executor=LocalExecutor(), now=now,
                           output_at=now - printed_s)
            dumps.close()
            s.commit()
            return attempt

    assert check(silent_s=25, printed_s=3).hang_detected_at is None
    attempt = check(silent_s=28, printed_s=8)
    assert attempt.hang_detected_at is None and attempt.watching == WATCH_STEPS_OR_OUTPUT
    with sessions() as s:
        (said,) = s.scalars(select(Event.message).where(Event.kind == "watch")).all()
    assert "no step completed for 25 s (threshold 20 s) after step 20, but the script wrote output 3 s ago" in said
    assert "counted as life" in said
    hung = check(silent_s=45, printed_s=25)
    assert hung.hang_detected_at is not None
    with sessions() as s:
        (message,) = s.scalars(select(Event.message).where(Event.kind == "hang")).all()
    assert "no step completed and no output for 45 s" in message
