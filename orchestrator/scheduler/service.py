"""The scheduler as a process: the one lock a data folder holds, its APScheduler jobs (``tick``,
``lease``, ``sweeps``, ``sysmon``, the alerts) and the thread that brings the tick forward when an
attempt's launcher ends, and :func:`serve`, which runs them until SIGTERM or SIGINT (``runyard scheduler``,
orchestrator/cli/ui.py). The reconcile loop itself is orchestrator/scheduler/loop.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from apscheduler.events import EVENT_SCHEDULER_SHUTDOWN, EVENT_SCHEDULER_START, SchedulerEvent
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from filelock import FileLock, Timeout
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from db import lease
from db.lease import Identity
from db.vocabulary.layout import SCHEDULER_LOCK_FILE
from db.vocabulary.settings import Settings
from orchestrator import OrchestratorError
from orchestrator.scheduler.alert_job import add_alert_jobs
from orchestrator.scheduler.loop import BEAT_EVERY_S, TICK_S, Scheduler, database_error
from orchestrator.scheduler.repeats import RepeatedErrors
from orchestrator.scheduler.sysmon import SAMPLE_S, SystemMonitor
from orchestrator.sweeps.reconcile import SWEEP_EVERY_S, SweepJob

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

logger = logging.getLogger(__name__)

WAKE_S = 0.05  # how often the exit files of running attempts are looked at (a stat each)
STOP_POLL_S = 0.1  # how often the main thread looks whether SIGTERM or SIGINT came


class SchedulerLocked(OrchestratorError):
    """Another scheduler already runs on this data folder."""


def acquire_lock(home: Path) -> FileLock:
    """Hold an exclusive lock on ``home/scheduler.lock`` for the life of the process (or until
    the caller releases the returned lock)."""
    home.mkdir(parents=True, exist_ok=True)
    lock = FileLock(home / SCHEDULER_LOCK_FILE, on_acquired=_record_pid)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise SchedulerLocked(
            f"another scheduler is already running on {home} (lock {home / SCHEDULER_LOCK_FILE}); "
            "stop it first, or set RUNYARD_HOME to another folder"
        ) from None
    return lock


def _record_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


def refuse_a_second_on_sqlite(sessions: sessionmaker[Session], settings: Settings) -> None:
    """On SQLite one scheduler serves one database: refuse to start beside a live scheduler of
    another data folder that uses the same database file (PostgreSQL takes several, db/lease.py).

    Raises:
        SchedulerLocked: such a scheduler's lease is live.
    """
    if not settings.db_url.startswith("sqlite"):
        return
    me = Identity(id=0, host=socket.gethostname(), home=str(settings.home))
    with sessions() as session:
        other = lease.other_live_scheduler(session, me)
    if other is not None:
        raise SchedulerLocked(
            f"another scheduler (pid {other.pid} on {other.host}, data folder {other.home}) already uses the "
            f"SQLite database {settings.db_url}; SQLite takes one scheduler per database: stop that one, "
            "or point RUNYARD_DB_URL at PostgreSQL to run several"
        )


class ExitWaker:
    """Brings the tick forward the moment a watched attempt's launcher writes its exit file (its
    retry starts sooner: the detection phase is not a tick long, issue 32).

    A daemon thread of its own stats the watched exit files every ``WAKE_S``, from APScheduler's
    start to its shutdown. It used to be an APScheduler job: 20 dispatches a second through the
    job store, the executor's pool and the event listeners cost an idle scheduler about 1.2% of a
    core, half of all it used.
    """

    def __init__(self, aps: BaseScheduler, scheduler: Scheduler, errors: RepeatedErrors):
        self.aps, self.scheduler, self.errors = aps, scheduler, errors
        self.stopped = threading.Event()
        self._lock = threading.Lock()

    def attach(self) -> None:
        """Run from ``aps``'s start (now, if it has started) to its shutdown (listeners of both)."""
        self.aps.add_listener(self._on_event, EVENT_SCHEDULER_START | EVENT_SCHEDULER_SHUTDOWN)
        if self.aps.running:
            self._start()

    def _on_event(self, event: SchedulerEvent) -> None:
        if event.code == EVENT_SCHEDULER_START:
            self._start()
        else:
            with self._lock:
                self.stopped.set()

    def _start(self) -> None:
        """One waker at a time: a start while one runs (the start event and ``attach`` both seeing
        APScheduler started) ends the earlier thread. Each thread has its own event, so one that
        has not yet seen its stop never misses it."""
        with self._lock:
            self.stopped.set()
            self.stopped = stopped = threading.Event()
        threading.Thread(target=self._run, args=(stopped,), name="exit-waker", daemon=True).start()

    def _run(self, stopped: threading.Event) -> None:
        while not stopped.wait(WAKE_S):
            try:
                if any(path.exists() for path in self.scheduler.watched_exits):
                    self.aps.modify_job("tick", next_run_time=datetime.now())
            except Exception as exc:  # noqa: BLE001 - the waker's loop boundary; the tick comes anyway
                self.errors.failed("wake", exc)


def wake(aps: BaseScheduler, job_id: str) -> None:
    """Bring job ``job_id`` forward to now, if ``aps`` has it (not on a test's ``add_jobs``
    alone). A job running at that moment is not run twice: its next run comes at its interval."""
    with contextlib.suppress(JobLookupError):
        aps.modify_job(job_id, next_run_time=datetime.now())


def add_jobs(aps: BaseScheduler, scheduler: Scheduler, monitor: SystemMonitor | None, tick_s: float = TICK_S) -> None:
    """Register the jobs on ``aps``: ``tick``, ``lease``, and ``sysmon`` (system metrics) when
    ``monitor``; and the :class:`ExitWaker` that brings the tick forward, for as long as ``aps`` runs.

    Each is its own job (``max_instances=1``, ``coalesce=True``) on APScheduler's thread pool,
    so a slow system sample never delays a tick; all catch and log their errors.
    """
    errors = RepeatedErrors(logger)

    def guarded_tick() -> None:
        settled = scheduler.settled
        try:
            scheduler.tick()
        except Exception as exc:  # noqa: BLE001 - the loop boundary; the database could not even be read
            if not scheduler.storage.failed("tick", exc):
                errors.failed("tick", exc)
            if isinstance(exc, OperationalError):
                scheduler._tell_ui([database_error(exc)], wrote=False)
        else:
            errors.succeeded("tick")
        if scheduler.settled != settled:  # an attempt ended: a sweep may start its next trial now
            wake(aps, "sweeps")

    aps.add_job(guarded_tick, "interval", seconds=tick_s, id="tick", max_instances=1, coalesce=True,
                misfire_grace_time=None, next_run_time=datetime.now())

    ExitWaker(aps, scheduler, errors).attach()

    def guarded_lease() -> None:
        try:
            scheduler.renew_lease()
        except OperationalError as exc:  # an unwritable database: the tick's heartbeat says so, once
            logger.debug("lease not renewed: %s", exc)
        except Exception as exc:  # noqa: BLE001 - the lease job's loop boundary
            errors.failed("lease", exc)
        else:
            errors.succeeded("lease")

    aps.add_job(guarded_lease, "interval", seconds=BEAT_EVERY_S, id="lease", max_instances=1, coalesce=True,
                misfire_grace_time=None)

    if monitor is not None:
        aps.add_job(monitor.job, "interval", seconds=SAMPLE_S, id="sysmon", max_instances=1, coalesce=True,
                    misfire_grace_time=None)


def add_sweep_job(aps: BaseScheduler, scheduler: Scheduler, every_s: float = SWEEP_EVERY_S) -> None:
    """Register ``sweeps`` on ``aps``: at the start, then every ``every_s``, a pass over each
    sweep (orchestrator/sweeps/reconcile.py), on its own thread of the pool like the other jobs;
    one sweep's failure is logged once, then counted, and the other sweeps' passes go on.

    The hand-off between two trials does not wait for the intervals: a tick that saw an attempt
    end brings this job forward (:func:`add_jobs`), and a pass that queued a run brings the tick
    forward, which launches it (a trial's end to the next trial's launch: bench/bench_sweep.py)."""
    sweeps = SweepJob(scheduler.sessions, scheduler.settings, scheduler.inventory,
                      errors=RepeatedErrors(logging.getLogger("orchestrator.sweeps")))
    errors = RepeatedErrors(logger)

    def guarded() -> None:
        queued = sweeps.queued
        try:
            sweeps.run()
        except Exception as exc:  # noqa: BLE001 - the sweeps job's loop boundary (the database could not be read)
            errors.failed("sweeps", exc)
        else:
            errors.succeeded("sweeps")
        if sweeps.queued != queued:
            wake(aps, "tick")

    aps.add_job(guarded, "interval", seconds=every_s, id="sweeps", max_instances=1, coalesce=True,
                misfire_grace_time=None, next_run_time=datetime.now())


def serve(scheduler: Scheduler, tick_s: float = TICK_S, monitor: SystemMonitor | None = None) -> None:
    """Run ``scheduler.tick`` and the system monitor on APScheduler until SIGTERM or SIGINT.

    ``monitor`` defaults to a ``SystemMonitor`` on the scheduler's database, reading its energy meter.
    """
    aps = BackgroundScheduler()
    scheduler.energy.warm()  # NVML started here, not inside the tick's first launch
    monitor = monitor or SystemMonitor(scheduler.sessions, energy=scheduler.energy)
    add_jobs(aps, scheduler, monitor, tick_s)
    add_sweep_job(aps, scheduler)  # sweeps: a pass over each every 2 s (orchestrator/sweeps)
    alerts = add_alert_jobs(aps, scheduler)  # alerts: a job beside the tick and a delivery thread (orchestrator/alerts)
    received: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        # Only a note: the handler runs on the main thread between two of its bytecodes, perhaps
        # inside a lock, and a shutdown (or a log line) from here took locks of its own. With
        # APScheduler's main loop on this thread, a SIGTERM inside its executor's submit (then 20 times
        # a second, for the exit files' wake) hung the scheduler on the executor's lock (CI 39).
        received.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    try:
        aps.start()  # its own thread; this one only waits for a signal
        while not received:
            time.sleep(STOP_POLL_S)
        logger.info("received %s; scheduler stopping (training keeps running)", signal.Signals(received[0]).name)
        aps.shutdown(wait=False)
    finally:
        monitor.close()  # the open window's aggregates
        alerts.close()
        scheduler.close()
