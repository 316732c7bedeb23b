"""Every retry timed by phase (issue 32): the marks rank 0 writes through its database writer, the
agent's note of the failure, and the phases `runyard show` and the Run page read from them."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from apscheduler.events import EVENT_SCHEDULER_START, SchedulerEvent
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.orm import Session, sessionmaker

from db import queries
from db.models import Attempt
from db.requests import create_run
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.phases import attempt_phases, recovery_s
from db.vocabulary.settings import Settings
from orchestrator.format import phases_text
from orchestrator.scheduler.diagnosis import first_failure_at
from orchestrator.scheduler.repeats import RepeatedErrors
from orchestrator.scheduler.service import ExitWaker, add_jobs
from tests.conftest import wait_until
from trainer import techniques
from trainer.reporting.reporter import DatabaseWriter

RANK_MARKS = {"spawned": 205.0, "imported": 207.5, "joined": 207.75, "data": 208.5, "checkpoint": 208.75}
FAILED = {"cause": "SIGNAL", "failed_at": 198.0, "ended_at": 199.0, "detected_at": 199.5}
RETRY = {"started_at": 200.0, "first_step_at": 209.0, "phase_marks": RANK_MARKS}


def test_a_recovery_is_timed_from_the_failure_to_the_first_step_phase_by_phase() -> None:
    phases = attempt_phases(RETRY, FAILED)
    assert phases is not None
    assert [(p["phase"], p["seconds"]) for p in phases] == [
        ("teardown", 1.0), ("detect", 0.5), ("relaunch", 0.5), ("launch", 5.0), ("import", 2.5),
        ("rendezvous", 0.25), ("data", 0.75), ("checkpoint", 0.25), ("first_step", 0.25)]
    assert sum(p["seconds"] for p in phases) == recovery_s(RETRY, FAILED) == 11.0
    assert phases_text(phases) == ("teardown 1.0s · detect 0.5s · relaunch 0.5s · launch 5.0s · import 2.5s · "
                                   "rendezvous 0.2s · data 0.8s · checkpoint 0.2s · first_step 0.2s = 11.0s")


def test_a_first_attempt_or_one_after_a_pause_has_only_its_start_up() -> None:
    fresh = attempt_phases(RETRY, None)
    assert fresh is not None
    assert [p["phase"] for p in fresh] == ["launch", "import", "rendezvous", "data", "checkpoint", "first_step"]
    assert sum(p["seconds"] for p in fresh) == 9.0
    paused = {**FAILED, "cause": None}
    assert attempt_phases(RETRY, paused) == fresh
    assert recovery_s(RETRY, paused) is None


def test_a_missing_mark_counts_in_the_next_phase_and_none_is_negative() -> None:
    # A script that never calls load_checkpoint: no data or checkpoint mark; a clock read on
    # another host put "joined" before "imported".
    marks = {"spawned": 205.0, "imported": 207.5, "joined": 207.0}
    phases = attempt_phases({**RETRY, "phase_marks": marks}, FAILED)
    assert phases is not None
    assert [p["phase"] for p in phases][-2:] == ["rendezvous", "first_step"]
    assert all(p["seconds"] >= 0 for p in phases)
    assert sum(p["seconds"] for p in phases) == 11.0
    # Before any mark of its own, an attempt has no phases (its launch is still under way).
    assert attempt_phases({**RETRY, "phase_marks": {}, "first_step_at": None}, FAILED) is None


def test_the_agent_note_of_the_failure(tmp_path: Path) -> None:
    assert first_failure_at(tmp_path) is None
    (tmp_path / "failure.json").write_text(json.dumps({"at": 123.5, "local_ranks": {"1": -9}}))
    assert first_failure_at(tmp_path) == 123.5
    (tmp_path / "failure.json").write_text("{")  # being written: the exit time serves
    assert first_failure_at(tmp_path) is None


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


class _Ticks:
    """Stands in for the Scheduler in add_jobs: counts its ticks, watches one exit file."""

    def __init__(self, exit_file: Path):
        self.ticks: list[float] = []
        self.watched_exits = frozenset({exit_file})

    def tick(self) -> None:
        self.ticks.append(time.monotonic())

    def renew_lease(self) -> None:
        pass


def test_an_exit_file_wakes_the_tick_at_once(tmp_path: Path) -> None:
    """The tick comes every 60 s here; the launcher's exit file of a watched attempt brings it
    within a fraction of a second: the detection phase is not a tick long (issue 32)."""
    ticks = _Ticks(tmp_path / "exit.json")
    aps = BackgroundScheduler()
    add_jobs(aps, cast(Any, ticks), None, tick_s=60.0)
    aps.start()
    try:
        deadline = time.monotonic() + 10
        while not ticks.ticks:  # the first tick, at the start
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)
        assert len(ticks.ticks) == 1  # nothing to wake it yet
        written = time.monotonic()
        (tmp_path / "exit.json").write_text('{"exit_code": 1}')
        while len(ticks.ticks) < 2:
            assert time.monotonic() < written + 5, "the exit file did not wake the tick"
            time.sleep(0.01)
        assert ticks.ticks[1] - written < 2.0
    finally:
        aps.shutdown(wait=True)
    # The waker's thread ends with APScheduler (a scheduler stopped and started again in one
    # process would otherwise stat the files twice as often).
    wait_until(lambda: not any(t.name == "exit-waker" for t in threading.enumerate()), 5,
               "the exit waker outlived the scheduler")


def test_jobs_added_to_a_running_scheduler_wake_too(tmp_path: Path) -> None:
    """``add_jobs`` on an APScheduler that has already started: the exit file still brings the
    tick forward (the waker starts at once instead of at a start event that has passed)."""
    ticks = _Ticks(tmp_path / "exit.json")
    aps = BackgroundScheduler()
    aps.start()
    try:
        add_jobs(aps, cast(Any, ticks), None, tick_s=60.0)
        deadline = time.monotonic() + 10
        while not ticks.ticks:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        written = time.monotonic()
        (tmp_path / "exit.json").write_text('{"exit_code": 1}')
        while len(ticks.ticks) < 2:
            assert time.monotonic() < written + 5, "the exit file did not wake the tick"
            time.sleep(0.01)
    finally:
        aps.shutdown(wait=True)


def test_a_start_event_after_attach_leaves_one_waker(tmp_path: Path) -> None:
    """APScheduler's start event arriving after ``attach`` already found it running (the two race
    when another thread starts it) ends the first waker's thread: one stats the exit files, not two,
    and it ends with APScheduler."""
    aps = BackgroundScheduler()
    aps.start()
    try:
        waker = ExitWaker(aps, cast(Any, _Ticks(tmp_path / "exit.json")), RepeatedErrors(logging.getLogger("t")))
        waker.attach()
        waker._on_event(SchedulerEvent(EVENT_SCHEDULER_START))
        deadline = time.monotonic() + 5
        while sum(t.name == "exit-waker" for t in threading.enumerate()) != 1:
            assert time.monotonic() < deadline, [t.name for t in threading.enumerate()]
            time.sleep(0.01)
    finally:
        aps.shutdown(wait=True)
    wait_until(lambda: not any(t.name == "exit-waker" for t in threading.enumerate()), 5,
               "the exit waker outlived the scheduler")


def test_a_retry_reads_the_cpu_peak_its_run_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempt measures the CPU peak and keeps it with the run; a later attempt on the
    same host reads it and measures nothing (every rank waited for that measurement at start-up);
    another host's figure is measured anew."""
    kept = tmp_path / "cpu_peak.json"
    measured: list[float] = []

    def measure() -> float:
        measured.append(1.5e11)
        return 1.5e11

    monkeypatch.setattr(techniques, "measure_cpu_peak_flops", measure)
    assert techniques.shared_cpu_peak_flops(kept) == 1.5e11 and len(measured) == 1
    assert techniques.shared_cpu_peak_flops(kept) == 1.5e11 and len(measured) == 1  # read back
    kept.write_text(json.dumps({"host": "elsewhere", "flops": 9e9}))
    assert techniques.shared_cpu_peak_flops(kept) == 1.5e11 and len(measured) == 2
    assert techniques.shared_cpu_peak_flops(None) == 1.5e11 and len(measured) == 3  # outside runyard: measured
