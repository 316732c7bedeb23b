"""What a launched run does before its first step, through rank 0's database writer
(trainer/reporting/reporter.py): SETUP and FIRST_STEP reported, the first step clears the phase,
the watchdog's clock is not reset by a phase, and the marks of every phase reach the attempt.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import queries
from db.models import Attempt
from db.requests import create_run
from db.states import AttemptPhase
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from tests.conftest import wait_until
from trainer.reporting.reporter import DatabaseWriter


def _attempt(sessions: sessionmaker[Session], settings: Settings) -> tuple[int, float]:
    started = time.time() - 30
    with sessions.begin() as s:
        run = create_run(s, RunConfig(), settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.flush()
        s.add(Attempt(run_id=run.id, number=1, status="RUNNING", dir=str(Path(run.run_dir) / "attempts" / "1"),
                      started_at=started))
        return run.id, started


def _read(sessions: sessionmaker[Session], run_id: int) -> tuple[str | None, float | None, int | None]:
    with sessions() as s:
        a = s.query(Attempt).filter_by(run_id=run_id, number=1).one()
        return a.phase, a.progress_at, a.last_step


def test_setup_then_first_step_then_the_first_step_clears_the_phase(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    run_id, _ = _attempt(sessions, settings)
    writer = DatabaseWriter(settings.db_url, run_id, 1, flush_interval_s=0.05)
    writer.start()
    try:
        writer.put_progress(None, phase=AttemptPhase.SETUP.value)
        wait_until(lambda: _read(sessions, run_id)[0] == "setup")
        # A start-up phase is no heartbeat: the watchdog keeps judging the start-up from the launch.
        assert _read(sessions, run_id)[1] is None
        writer.put_progress(None, phase=AttemptPhase.FIRST_STEP.value)
        wait_until(lambda: _read(sessions, run_id)[0] == "first_step")
        writer.put_progress(1)
        wait_until(lambda: _read(sessions, run_id)[2] == 1)
        phase, progress_at, _ = _read(sessions, run_id)
        assert phase is None and progress_at is not None
        writer.put_progress(None, phase=AttemptPhase.FINISHING.value)
        writer.put_progress(2)  # a step after the loop's end keeps "finishing" (only start-up phases clear)
        wait_until(lambda: _read(sessions, run_id)[2] == 2)
        assert _read(sessions, run_id)[0] == "finishing"
    finally:
        writer.close()


RANK_MARKS = {"spawned": 205.0, "imported": 207.5, "joined": 207.75, "data": 208.5, "checkpoint": 208.75}


def test_rank_0_marks_reach_the_attempt_and_its_phases(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as s:
        run = create_run(s, RunConfig(), settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.flush()
        run_id = run.id
        s.add(Attempt(run_id=run_id, number=1, status="RUNNING", dir=str(Path(run.run_dir) / "attempts" / "1"),
                      started_at=200.0))
    writer = DatabaseWriter(settings.db_url, run_id, 1, flush_interval_s=0.05)
    writer.start()
    try:
        writer.put("marks", {k: RANK_MARKS[k] for k in ("spawned", "imported", "joined")})
        writer.put("marks", {k: RANK_MARKS[k] for k in ("data", "checkpoint")})  # later: merged, not replaced
        writer.put_progress(1)
    finally:
        writer.close()
    with sessions() as s:
        (attempt,) = queries.attempts_of(s, run_id)
    assert attempt["phase_marks"] == RANK_MARKS
    assert attempt["phases"][-1]["phase"] == "first_step"
    assert attempt["first_step_at"] == pytest.approx(time.time(), abs=60)
