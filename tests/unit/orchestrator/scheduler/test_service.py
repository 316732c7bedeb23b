"""The scheduler as a process (orchestrator/scheduler/service.py): one per data folder, and the
launcher's exit file of a watched attempt wakes the tick at once (issue 32), whenever its jobs
were added, with one waker thread that ends with APScheduler; a trial's end launches the next
trial of its sweep without waiting for the jobs' intervals."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from apscheduler.events import EVENT_SCHEDULER_START, SchedulerEvent
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.orm import Session, sessionmaker

from db.states import TERMINAL
from db.vocabulary.settings import Settings
from orchestrator.scheduler.repeats import RepeatedErrors
from orchestrator.scheduler.service import ExitWaker, SchedulerLocked, acquire_lock, add_jobs, add_sweep_job
from tests.conftest import wait_until
from tests.unit.orchestrator.sweeps.fake_trials import end, machine, run_of, start, status, trials

TERMINAL_NAMES = {s.value for s in TERMINAL}


def test_one_scheduler_per_data_folder(settings: Settings) -> None:
    lock = acquire_lock(settings.home)
    try:
        with pytest.raises(SchedulerLocked, match="already running"):
            acquire_lock(settings.home)
    finally:
        lock.release()
    acquire_lock(settings.home).release()  # released: the next scheduler may start


RANK_MARKS = {"spawned": 205.0, "imported": 207.5, "joined": 207.75, "data": 208.5, "checkpoint": 208.75}


class _Ticks:
    """Stands in for the Scheduler in add_jobs: counts its ticks, watches one exit file."""

    def __init__(self, exit_file: Path):
        self.ticks: list[float] = []
        self.watched_exits = frozenset({exit_file})
        self.settled = 0

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


def test_a_trials_end_launches_the_next_without_waiting_for_the_intervals(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    """The sweeps job comes every ten minutes here, after its first pass at the start (the tick
    every half second, as it does). A trial's end still makes and launches the next trial at once:
    a tick that saw an attempt end brings the sweeps job forward, which queues the next trial (and
    brings the tick forward, which launches it). Without that, the next trial would wait for the
    job's interval: ten minutes here, up to 2 s in the product (bench/bench_sweep.py's gap)."""
    sweep_id = start(sessions, slots=1, max_trials=2, max_concurrent=1)
    scheduler, _job = machine(sessions, settings, slots=1)
    aps = BackgroundScheduler()
    add_jobs(aps, scheduler, None)
    add_sweep_job(aps, scheduler, every_s=600.0)
    aps.start()
    try:
        wait_until(lambda: len(trials(sessions, sweep_id)) == 1
                   and status(sessions, run_of(sessions, sweep_id, 0).id) == "STARTING", 30,
                   "the first pass made no trial, or the tick did not launch it")
        end(sessions, run_of(sessions, sweep_id, 0).id)
        wait_until(lambda: len(trials(sessions, sweep_id)) == 2
                   and status(sessions, run_of(sessions, sweep_id, 1).id) == "STARTING", 30,
                   "the next trial was not made and launched at the first trial's end")
        assert status(sessions, run_of(sessions, sweep_id, 0).id) in TERMINAL_NAMES
    finally:
        aps.shutdown(wait=True)
        scheduler.close()
