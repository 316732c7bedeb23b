"""The scheduler: the only process that launches or signals training processes.

Run it with ``runyard scheduler`` (``runyard up`` starts it beside the UI). One APScheduler job,
``tick``, runs every half second (``max_instances=1``, ``coalesce=True``): look at what the
database wants, look at what the machine has, make them agree. Every step is idempotent, so
killing and restarting the scheduler at any moment converges: live attempts are re-adopted by
pid and create time (from the launcher's own record when the scheduler died before committing
the pid), vanished ones are recorded as crashed. A second job, ``sysmon``, samples the host, the
runs' processes and the GPUs every 2 s (orchestrator/scheduler/sysmon.py).

No run trains twice: an attempt is settled only once every process of the run is gone (found by
the environment runyard gave it, not only by the process tree), and the next attempt starts only
after the same sweep. Stack dumps run on the scheduler's own small thread pool, never in the tick.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apscheduler.events import EVENT_SCHEDULER_SHUTDOWN, EVENT_SCHEDULER_START, SchedulerEvent
from apscheduler.schedulers.background import BackgroundScheduler
from filelock import FileLock, Timeout
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from db import lease
from db.lease import Identity
from db.models import Attempt, Checkpoint, Event, Run, SchedulerHeartbeat
from db.requests import checkpoints_dir, newest_intact
from db.states import (
    ACTIVE,
    STOPPING,
    AttemptStatus,
    RunStatus,
    SignalSent,
    StopReason,
    attempt_transition,
    hold,
    transition,
)
from db.vocabulary.causes import Cause
from db.vocabulary.config import config_from_json, write_config_file
from db.vocabulary.inventory import Inventory
from db.vocabulary.layout import SCHEDULER_LOCK_FILE, AttemptPaths, RunPaths
from db.vocabulary.scheduler_file import SchedulerFile
from db.vocabulary.settings import Settings
from orchestrator import OrchestratorError
from orchestrator.executors.base import Executor, ExecutorError, LaunchRequest, Liveness, executor_for
from orchestrator.executors.launcher import free_port, rank_env, torchrun_argv
from orchestrator.executors.local import CommandFactory, LocalExecutor, stop_signal
from orchestrator.executors.slurm.executor import SlurmExecutor
from orchestrator.executors.stacks import StackDumps
from orchestrator.scheduler import watchdog
from orchestrator.scheduler.admission import Admission, current_attempt
from orchestrator.scheduler.alert_job import add_alert_jobs
from orchestrator.scheduler.outcomes import attempt_config, launch_failed_on_storage, next_overrides, settle
from orchestrator.scheduler.repeats import RepeatedErrors, signature
from orchestrator.scheduler.sysmon import SAMPLE_S, SystemMonitor
from orchestrator.scripts import checkpoint_custody
from orchestrator.scripts.attempt_watch import ScriptWatch
from trainer.context import RunContext
from trainer.process.store_secret import SECRET_VAR, new_secret

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

    from orchestrator.scheduler.sysmon import SystemMonitor

logger = logging.getLogger(__name__)

TICK_S = 0.5
WAKE_S = 0.05  # how often the exit files of running attempts are looked at (a stat each)
STOP_POLL_S = 0.1  # how often the main thread looks whether SIGTERM or SIGINT came
# The heartbeat row is rewritten at most this often (the UI calls a scheduler silent for 10 s
# offline): one write every few ticks instead of a commit on every one.
BEAT_EVERY_S = 2.0
# A launch whose launcher is not seen alive within this long after the attempt row was written,
# and that left no launch record, is taken as lost (the scheduler died between writing the row
# and starting the process).
LAUNCH_LOST_S = 30.0


def database_error(exc: OperationalError) -> str:
    """The sentence for a database that refused a write: the driver's own first line."""
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"database not writable: {detail[0] if detail else type(exc).__name__}"


def default_executors(command: CommandFactory, settings: Settings) -> dict[str, Executor]:
    """The local executor, and the Slurm one (it runs no Slurm command until a Slurm run is
    submitted; without Slurm's commands that submit fails with a sentence that says so)."""
    return {"local": LocalExecutor(command), "slurm": SlurmExecutor(home=str(settings.home))}


class SchedulerLocked(OrchestratorError):
    """Another scheduler already runs on this data folder."""


class Scheduler:
    """The reconcile loop. ``tick()`` is safe to call directly (the tests do)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        settings: Settings,
        inventory: Inventory,
        command: CommandFactory = torchrun_argv,
        host: str | None = None,
        executors: dict[str, Executor] | None = None,
    ):
        """
        Args:
            command: The local executor's command (tests: a plain process instead of torchrun).
            host: This scheduler's host name (tests name another to act as a second node).
            executors: By name (``launch.executor``); default: local, and Slurm when its commands
                are installed (orchestrator/executors/slurm/executor.py).
        """
        self.sessions = sessions
        self.host = host or socket.gethostname()
        self.settings = settings
        self.inventory = inventory
        self.admission = Admission(inventory, self.host, self._start_attempt)
        self.executors = executors if executors is not None else default_executors(command, settings)
        self.dumps = StackDumps()
        self.scripts = ScriptWatch()
        self._heartbeat_id: int | None = None
        self._heartbeat_new = False  # the row was inserted by a commit still to come
        self._beat_at = -math.inf
        self._started_at = time.time()
        # The exit files of the local attempts the last tick saw alive: a file appearing there
        # wakes the tick at once (add_jobs' ``wake``) instead of up to a tick later (issue 32).
        self.watched_exits: frozenset[Path] = frozenset()
        self._alive_exits: set[Path] = set()
        self._errors = RepeatedErrors(logger)
        self._file = SchedulerFile(settings.scheduler_file)
        self._file_at = -math.inf
        self._published_inventory = inventory.to_json()  # fixed for the process's life
        self._db_problem: str | None = None
        self._db_problem_since: float | None = None

    def close(self) -> None:
        """Stop the stack-dump pool (dumps in flight finish in the background)."""
        self.dumps.close()
        self._file.close()

    # -- the loop -------------------------------------------------------------------------

    def tick(self) -> None:
        """One reconcile pass: heartbeat, supervise active runs, admit queued ones.

        Each part commits on its own and one part's failure does not stop the others (one run's
        corrupt row, a full disk). A failure is logged once with its traceback, then counted
        (orchestrator/scheduler/repeats.py). Whether the database could be written is told to the UI
        through the heartbeat file, which works when the database does not.
        """
        db_errors: list[str] = []
        self._alive_exits = set()
        with self.sessions() as session:
            beat = self._guarded(session, "heartbeat", self._beat, db_errors)
            me = self.identity()
            if me is None:  # no lease row yet (its insert failed): nothing can be owned this tick
                self._tell_ui(db_errors, wrote=False)
                return
            mine = self._guarded(session, "leases", partial(self._leases, me=me), db_errors)
            self._guarded(session, "poll", partial(self._poll, run_ids=mine if isinstance(mine, list) else []),
                          db_errors)
            for run_id in mine if isinstance(mine, list) else []:
                if self._guarded(session, f"run {run_id}", partial(self._supervise_id, run_id=run_id),
                                 db_errors) is None:
                    # Rolled back: what the run's collectors read this tick was not stored.
                    self.scripts.forget_run(run_id)
            if self.scripts.live():
                self._guarded(session, "script watchers", self._prune_script_watchers, db_errors)
            self._guarded(session, "admission", self.admission.admit, db_errors)
        self.watched_exits = frozenset(self._alive_exits)  # one swap: the wake job reads it meanwhile
        self._tell_ui(db_errors, wrote=bool(beat))

    def _guarded(self, session: Session, where: str, step: Callable[[Session], object],
                 db_errors: list[str]) -> object:
        """Run one part of the tick and commit it; on failure roll back, log it (once, then
        counted) and note a database that could not be written."""
        try:
            result = step(session)
            session.commit()
        except Exception as exc:  # noqa: BLE001 - one part's failure must not stop the tick
            session.rollback()
            self._errors.failed(where, exc)
            if isinstance(exc, OperationalError):
                db_errors.append(database_error(exc))
            if where == "heartbeat":
                self._beat_rolled_back()
            return None
        self._errors.succeeded(where)
        return result

    def identity(self) -> Identity | None:
        """This scheduler's lease identity; None until its heartbeat row exists."""
        if self._heartbeat_id is None:
            return None
        return Identity(id=self._heartbeat_id, host=self.host, home=str(self.settings.home))

    def _leases(self, session: Session, me: Identity) -> list[int]:
        """The active runs this scheduler supervises: its own, and those of schedulers presumed
        dead, taken over now (db/lease.py) and told in an event."""
        mine, taken = lease.to_supervise(session, me)
        now = time.time()
        for run, owner in taken:
            number = session.scalar(select(Attempt.number).where(Attempt.id == run.attempt_id))
            message = (f"attempt {number} taken over by scheduler #{me.id} (pid {os.getpid()} on {me.host}) "
                       f"from {owner}, presumed dead")
            logger.warning("run %d: %s", run.run_id, message)
            session.add(Event(run_id=run.run_id, attempt=number, at=now, level="warning", kind="scheduler",
                              message=message))
        return mine

    def renew_lease(self) -> None:
        """Keep this scheduler's lease live while a long tick (a large checkpoint copied) holds the
        tick thread; writes nothing while the tick's own heartbeat keeps it fresh."""
        scheduler_id = self._heartbeat_id
        if scheduler_id is None or self._heartbeat_new:
            return
        with self.sessions() as session:
            if lease.renew(session, scheduler_id, every_s=2 * BEAT_EVERY_S):
                session.commit()

    def _supervise_id(self, session: Session, run_id: int) -> bool:
        run = session.get(Run, run_id)
        if run is not None:
            self._supervise(session, run)
        return True

    def _prune_script_watchers(self, session: Session) -> None:
        """Forget the collectors of attempts that are not running any more (ended without
        :meth:`ScriptWatch.finish`, e.g. settled by another path, or a run edited by hand)."""
        live = {(r, n) for r, n in session.execute(
            select(Attempt.run_id, Attempt.number).join(Run, Run.id == Attempt.run_id)
            .where(Attempt.status == AttemptStatus.RUNNING.value, Run.status.in_([s.value for s in ACTIVE]))).all()}
        for run_id, number in self.scripts.prune(live):
            logger.info("run %d attempt %d: its script watcher is forgotten (the attempt is not running)",
                        run_id, number)

    def _script_step(self, session: Session, run: Run, attempt: Attempt, what: str,
                     step: Callable[[], None]) -> None:
        """Run a script watcher's step (``tick``/``finish``) in a transaction of its own, so that
        its failure (a file that cannot be read, a write refused) neither stops the rest of the
        supervision (cancel, hang watchdog, settling) nor loses what it read: on failure its
        writes are rolled back, the attempt's collector is forgotten (the next tick reads again
        from the start), and the problem is logged and told in a warning event once."""
        session.commit()  # what supervision wrote so far is kept whatever the watcher does
        where = f"run {run.id} attempt {attempt.number} script {what}"
        try:
            step()
            session.commit()
        except Exception as exc:  # noqa: BLE001 - any failure: the rest of the supervision must run
            session.rollback()
            self.scripts.forget(run.id, attempt.number)
            new = self._errors.failing(where) != signature(exc)
            self._errors.failed(where, exc)
            if new:
                session.add(Event(run_id=run.id, attempt=attempt.number, at=time.time(), level="warning",
                                  kind="metrics", message=f"reading the script's metrics and checkpoint files failed "
                                                          f"({what}): {signature(exc)}; "
                                                          "read again from the start at the next tick"))
            return
        self._errors.succeeded(where)

    def _beat(self, session: Session) -> bool:
        """Insert this scheduler's heartbeat row, or refresh it every BEAT_EVERY_S.

        Returns:
            Whether a write is pending (the caller commits).
        """
        now = time.time()
        if self._heartbeat_id is None:
            hb = SchedulerHeartbeat(host=self.host, pid=os.getpid(), started_at=self._started_at,
                                    beat_at=now, home=str(self.settings.home))
            session.add(hb)
            session.flush()
            self._heartbeat_id, self._heartbeat_new = hb.id, True
        elif now - self._beat_at >= BEAT_EVERY_S:
            stored = session.get(SchedulerHeartbeat, self._heartbeat_id)
            if stored is None:  # deleted by hand: start a new row
                self._heartbeat_id = None
                return self._beat(session)
            stored.beat_at = now
        else:
            return False
        self._beat_at = now
        return True

    def _beat_rolled_back(self) -> None:
        """The heartbeat's commit failed: an inserted row does not exist, and the beat is due again."""
        if self._heartbeat_new:
            self._heartbeat_id = None
        self._heartbeat_new = False
        self._beat_at = -math.inf

    def _tell_ui(self, db_errors: list[str], wrote: bool) -> None:
        """Keep the heartbeat file current: alive, and whether the database could be written (a
        database error in this tick says no; a heartbeat written without one says yes)."""
        self._heartbeat_new = self._heartbeat_new and not wrote
        now = time.time()
        problem = db_errors[0] if db_errors else (None if wrote else self._db_problem)
        if problem != self._db_problem:
            self._db_problem_since = now if problem else None
            if problem:
                logger.error("the database is not writable: %s; runs are not being updated", problem)
            else:
                logger.warning("the database is writable again")
        elif now - self._file_at < BEAT_EVERY_S:
            return
        self._db_problem = problem
        self._file_at = now
        self._file.write({"pid": os.getpid(), "host": socket.gethostname(), "started_at": self._started_at,
                          "written_at": now, "db_writable": problem is None, "db_error": problem,
                          "db_error_since": self._db_problem_since, "inventory": self._published_inventory})

    def _poll(self, session: Session, run_ids: list[int]) -> None:
        """One look per executor at the running attempts of the runs this scheduler supervises
        (one ``squeue`` for all Slurm jobs), before each run is supervised from what it saw. The
        local executor looks at each process when it is supervised: only the others' attempts are
        read here."""
        attempts = session.scalars(
            select(Attempt).where(Attempt.run_id.in_(run_ids), Attempt.status == AttemptStatus.RUNNING.value,
                                  Attempt.executor != "local")
        ).all() if run_ids else []
        for name, executor in self.executors.items():
            executor.poll([a for a in attempts if a.executor == name])

    def executor_of(self, attempt: Attempt | None, run: Run | None = None) -> Executor:
        """The executor that runs ``attempt`` (or, before it exists, the one ``run`` asks for)."""
        if attempt is not None:
            return executor_for(self.executors, attempt.executor)
        assert run is not None
        return executor_for(self.executors, run.executor)

    def _start_attempt(self, session: Session, run: Run, devices: list[int]) -> None:
        """Launch the run's next attempt, if this scheduler wins the run: the transition to
        STARTING is a conditional UPDATE, and only the scheduler whose UPDATE moved the run writes
        the attempt (owned by it) and launches it; another scheduler racing for it sees False."""
        expect = RunStatus(run.status)  # read again if an earlier run's lost race rolled back (expired) it
        if expect not in (RunStatus.QUEUED, RunStatus.RETRYING) or not hold(session, run.id, expect):
            return  # another scheduler launched it meanwhile: its processes must not be swept below
        previous = current_attempt(session, run)
        number = (previous.number if previous else 0) + 1
        if previous is not None and not self.executor_of(previous).sweep(session, run, previous.number, None):
            return  # an earlier attempt's process outlived SIGKILL: the run waits (the event says so)
        try:
            executor = self.executor_of(None, run)
        except ExecutorError as exc:
            transition(session, run.id, RunStatus.FAILED, str(exc), expect=expect)
            return
        overrides = next_overrides(run, previous)
        # The starting point first: placing a script's checkpoint copies files (gigabytes), and the
        # write lock must not be held meanwhile, so what was written so far is committed and the
        # run's rows are written after. A crash or a refused transition after a copy leaves at most
        # an orphan copy or a file moved aside (checkpoint_custody's docstring).
        session.commit()
        resume_dir, resume_step = self._resume_point(session, run, number)
        script_resume = checkpoint_custody.resume_point(session, run, number) if resume_dir is None else None
        if script_resume is not None:
            resume_step = script_resume.step
        if not transition(session, run.id, RunStatus.STARTING, f"launching attempt {number}", expect=expect):
            session.rollback()
            return
        attempt_dir = RunPaths(Path(run.run_dir)).attempt(number).root
        port = free_port() if executor.name == "local" else None
        attempt = Attempt(
            run_id=run.id,
            number=number,
            status=AttemptStatus.RUNNING.value,
            dir=str(attempt_dir),
            port=port,
            devices_json=json.dumps(devices),
            device_kind=self.inventory.device_label if executor.name == "local" else "slurm",
            executor=executor.name,
            started_at=time.time(),
            resume_dir=resume_dir,
            resume_step=resume_step,
            resume_path=script_resume.path if script_resume is not None else None,
            overrides_json=json.dumps(overrides),
            scheduler_id=self._heartbeat_id,
        )
        run.retry_at = None
        run.resume_checkpoint_id = None  # the request is consumed by this attempt
        run.start_fresh = False
        session.add(attempt)
        # Commit before launching: a scheduler that dies right after the launch finds the row
        # and re-adopts the processes instead of launching the run a second time.
        session.commit()

        config = attempt_config(run, attempt)
        env = RunContext(
            run_id=run.id, attempt=number, db_url=self.settings.db_url, run_dir=Path(run.run_dir),
            attempt_dir=attempt_dir, resume_dir=Path(resume_dir) if resume_dir is not None else None,
            resume_step=resume_step,
            resume_path=Path(attempt.resume_path) if attempt.resume_path is not None else None,
        ).to_env()
        # A fresh secret per attempt, under which every key of its stores lies: another local
        # account can reach the stores' loopback ports, but cannot name a key (trainer/process/store_secret.py).
        # It travels in the environment only (owner-readable), never on a command line.
        env[SECRET_VAR] = new_secret()
        if self.inventory.kind == "gpu" and executor.name == "local":  # Slurm gives its jobs their GPUs
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
            # The devices are NVML's indices (orchestrator/scheduler/resources.py), which follow the
            # PCI bus; CUDA's own default order puts the fastest first, another order on mixed GPUs.
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        # A script's ranks move into workload.workdir themselves (trainer/process/script_runner.py): a
        # user's trainer.py there must not shadow runyard's packages in the shim and torchrun.
        cwd = Path(run.run_dir)
        env = {**rank_env(config, os.environ), **env}
        resuming = script_resume.with_args if script_resume is not None else attempt.resume_path is not None
        longest_save = session.scalar(select(func.max(Checkpoint.total_s)).where(Checkpoint.run_id == run.id))
        request = LaunchRequest(run_id=run.id, number=number, config=config, attempt_dir=attempt_dir, cwd=cwd,
                                env=env, port=port or 0, resuming=resuming, devices=devices,
                                checkpoint_s=float(longest_save) if longest_save is not None else None)
        try:
            # The attempt's effective config, written once: its ranks read this file (trainer/context.py).
            write_config_file(RunPaths(Path(run.run_dir)).attempt(number).config, config)
            what = executor.submit(request, attempt)
        except (OSError, ExecutorError) as exc:
            if isinstance(exc, OSError) and launch_failed_on_storage(session, run, attempt, exc, time.time()):
                # The storage, not runyard: one line, no traceback; the retry policy has the run.
                logger.warning("run %d: attempt %d: %s", run.id, number, attempt.reason)
                session.commit()
                return
            logger.exception("run %d: launch failed", run.id)
            why = f"launch failed: {exc}"
            attempt.cause, attempt.exception = Cause.LAUNCH_FAILED.value, why
            attempt_transition(attempt, AttemptStatus.FAILED, why)
            transition(session, run.id, RunStatus.FAILED, why)
            session.commit()
            return
        session.add(Event(run_id=run.id, attempt=number, at=time.time(), kind="launch",
                          message=f"attempt {number} launched: {what}"))
        session.commit()
        logger.info("run %d: attempt %d launched (%s)", run.id, number, what)

    @staticmethod
    def _resume_point(session: Session, run: Run, number: int) -> tuple[str | None, int | None]:
        """Where the next attempt starts: the checkpoint a resume request names; else, after an
        earlier attempt, this run's newest verified checkpoint of its current lineage; else (a
        first attempt, or a retry before the run has a checkpoint of its own) a fork's origin;
        else from scratch. The trainer verifies it and falls back to an older
        checkpoint in the same folder if it is refused."""
        chosen: Checkpoint | None = None
        if run.start_fresh:  # a rerun
            return None, None
        if run.resume_checkpoint_id is not None:
            chosen = session.get(Checkpoint, run.resume_checkpoint_id)
        elif number > 1:
            chosen = session.execute(
                select(Checkpoint)
                .where(Checkpoint.run_id == run.id, Checkpoint.verified.is_(True), Checkpoint.deleted.is_(False),
                       Checkpoint.path.like(f"{checkpoints_dir(run)}/step-%"))
                .order_by(Checkpoint.step.desc(), Checkpoint.id.desc())
                .limit(1)
            ).scalar_one_or_none()
            if chosen is None and run.parent_checkpoint_id is not None and newest_intact(session, run.id) is None:
                chosen = session.get(Checkpoint, run.parent_checkpoint_id)  # a fork's retry before its own save
        elif run.parent_checkpoint_id is not None:
            chosen = session.get(Checkpoint, run.parent_checkpoint_id)
        if chosen is None or chosen.source == checkpoint_custody.SCRIPT:
            return None, None  # a script's own file: checkpoint_custody.resume_point
        return str(Path(chosen.path).parent), chosen.step

    # -- supervision ----------------------------------------------------------------------

    def _supervise(self, session: Session, run: Run) -> None:
        attempt = current_attempt(session, run)
        if attempt is None or attempt.status != AttemptStatus.RUNNING.value:
            # An active run always has a running attempt (both are written in one commit); if
            # not, the database was edited by hand: end the run rather than guess.
            transition(session, run.id, RunStatus.FAILED, "no running attempt found for an active run")
            return
        executor = self.executor_of(attempt)
        if not executor.has_handle(attempt):
            executor.adopt(session, run, attempt)
        seen = executor.observe(session, run, attempt)
        if seen.liveness is Liveness.UNSETTLED:
            return  # gone from Slurm's queue without a word yet: waits for the marker or accounting
        if seen.liveness is Liveness.VANISHED and not executor.has_handle(attempt) \
                and time.time() - attempt.started_at < LAUNCH_LOST_S:
            return  # being launched right now by this very tick, or a moment ago
        if seen.liveness is not Liveness.ALIVE:
            self._settle(session, run, attempt, seen.exited)
            return
        if executor.name == "local":
            self._alive_exits.add(AttemptPaths(Path(attempt.dir)).exit_file)

        # Alive.
        config = config_from_json(run.config_json)
        status = RunStatus(run.status)
        if status is RunStatus.STARTING and attempt.first_step_at is not None:
            transition(session, run.id, RunStatus.RUNNING, f"attempt {attempt.number}: first step completed",
                       expect=RunStatus.STARTING)
        elif status is RunStatus.STARTING and config.workload.kind == "script" and executor.ranks_running(run, attempt):
            # A script need not report steps: its ranks running is all that can be seen.
            transition(session, run.id, RunStatus.RUNNING, f"attempt {attempt.number}: the script's ranks are running",
                       expect=RunStatus.STARTING)
        if config.workload.kind == "script":
            self._script_step(session, run, attempt, "tick",
                              partial(self.scripts.tick, session, run, attempt, config))
        if status in STOPPING:
            self._stop(session, run, attempt, config.supervision.grace_s)
        elif not executor.queued(attempt):
            script = config.workload.kind == "script"
            output_at = self.scripts.output_at(run.id, attempt.number) if script else None
            watchdog.check(session, run, attempt, config.supervision, script=script, dumps=self.dumps,
                           executor=executor, output_at=output_at)
        if run.dump_requested_at is not None:
            watchdog.serve_dump_request(session, run, attempt, self.dumps, executor)

    def _settle(self, session: Session, run: Run, attempt: Attempt, exited: dict[str, Any] | None) -> None:
        """Settle an attempt whose launcher ended, once nothing of the run lives any more."""
        if not self.executor_of(attempt).sweep(session, run, attempt.number, attempt):
            return  # a process outlived SIGKILL: the attempt stays (and holds its devices) until it is gone
        if not watchdog.hang_evidence_kept(session, run, attempt, self.dumps):
            return  # it ended during its hang's stack dump: settled once the dump's evidence is recorded
        for key in (watchdog.hang_key(run.id, attempt.number), watchdog.request_key(run.id, attempt.number)):
            self.dumps.discard(key)
        config = config_from_json(run.config_json)
        if config.workload.kind == "script":
            self._script_step(session, run, attempt, "finish",
                              partial(self.scripts.finish, session, run, attempt, config))
            self.scripts.forget(run.id, attempt.number)  # finished, or failed: settled either way
        settle(session, run, attempt, exited)

    def _stop(self, session: Session, run: Run, attempt: Attempt, grace_s: float) -> None:
        """Cancel or pause: SIGTERM, or a script's ``workload.stop_signal`` (the ranks finish the
        step and checkpoint), SIGKILL after grace."""
        now = time.time()
        executor = self.executor_of(attempt)
        if attempt.signal_sent is None:
            # Every attempt of the run, not only the newest: an older one's orphan must not outlive
            # the cancel (none should exist; this makes sure).
            executor.end_older(run, attempt)
            if not executor.terminate(run, attempt):
                return  # launched a moment ago and torchrun is not up yet: try again next tick
            sent = graceful_signal(run)
            attempt.signal_sent, attempt.signal_sent_at = sent.value, now
            attempt.stop_reason = StopReason(run.stop_mode or StopReason.CANCEL).value
            session.add(Event(run_id=run.id, attempt=attempt.number, at=now, kind="signal",
                              message=f"{attempt.stop_reason}: {sent.value} sent; the ranks checkpoint and exit; "
                                      f"SIGKILL in {grace_s:.0f} s if still running"))
        elif attempt.signal_sent != SignalSent.SIGKILL and now - (attempt.signal_sent_at or now) > grace_s:
            executor.kill(run, attempt)
            executor.end_older(run, attempt)
            first = attempt.signal_sent
            attempt.signal_sent, attempt.signal_sent_at = SignalSent.SIGKILL.value, now
            session.add(Event(run_id=run.id, attempt=attempt.number, at=now, level="warning", kind="signal",
                              message=f"still running {grace_s:.0f} s after {first}: SIGKILL sent"))


def graceful_signal(run: Run) -> SignalSent:
    """The first signal of a pause or a cancel, as recorded on the attempt."""
    return SignalSent(stop_signal(run).name)


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


def add_jobs(aps: BaseScheduler, scheduler: Scheduler, monitor: SystemMonitor | None, tick_s: float = TICK_S) -> None:
    """Register the jobs on ``aps``: ``tick``, ``lease``, and ``sysmon`` (system metrics) when
    ``monitor``; and the :class:`ExitWaker` that brings the tick forward, for as long as ``aps`` runs.

    Each is its own job (``max_instances=1``, ``coalesce=True``) on APScheduler's thread pool,
    so a slow system sample never delays a tick; all catch and log their errors.
    """
    errors = RepeatedErrors(logger)

    def guarded_tick() -> None:
        try:
            scheduler.tick()
        except Exception as exc:  # noqa: BLE001 - the loop boundary; the database could not even be read
            errors.failed("tick", exc)
            if isinstance(exc, OperationalError):
                scheduler._tell_ui([database_error(exc)], wrote=False)
        else:
            errors.succeeded("tick")

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


def serve(scheduler: Scheduler, tick_s: float = TICK_S, monitor: SystemMonitor | None = None) -> None:
    """Run ``scheduler.tick`` and the system monitor on APScheduler until SIGTERM or SIGINT.

    ``monitor`` defaults to a ``SystemMonitor`` on the scheduler's database.
    """
    aps = BackgroundScheduler()
    monitor = monitor or SystemMonitor(scheduler.sessions)
    add_jobs(aps, scheduler, monitor, tick_s)
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
