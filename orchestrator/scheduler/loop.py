"""The scheduler: the only process that launches or signals training processes.

Run it with ``runyard scheduler`` (``runyard up`` starts it beside the UI; the process around the
loop, its lock and its jobs: orchestrator/scheduler/service.py). One APScheduler job, ``tick``,
runs every half second (``max_instances=1``, ``coalesce=True``): look at what the database wants,
look at what the machine has, make them agree. Every step is idempotent, so killing and
restarting the scheduler at any moment converges: live attempts are re-adopted by pid and create
time (from the launcher's own record when the scheduler died before committing the pid), vanished
ones are recorded as crashed. A second job, ``sysmon``, samples the host, the runs' processes and
the GPUs every 2 s (orchestrator/scheduler/sysmon.py).

No run trains twice: an attempt is settled only once every process of the run is gone (found by
the environment runyard gave it, not only by the process tree), and the next attempt starts only
after the same sweep (orchestrator/scheduler/attempts.py starts and stops attempts,
orchestrator/scheduler/outcomes.py settles them). Stack dumps run on the scheduler's own small
thread pool, never in the tick.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from db import lease
from db.lease import Identity
from db.models import Attempt, Event, Run, SchedulerHeartbeat
from db.states import ACTIVE, STOPPING, AttemptStatus, RunStatus, transition
from db.vocabulary.config import config_from_json
from db.vocabulary.inventory import Inventory
from db.vocabulary.layout import AttemptPaths
from db.vocabulary.scheduler_file import SchedulerFile
from db.vocabulary.settings import Settings
from orchestrator.executors.base import Executor, Liveness, executor_for
from orchestrator.executors.launcher import torchrun_argv
from orchestrator.executors.local import CommandFactory, LocalExecutor
from orchestrator.executors.slurm.executor import SlurmExecutor
from orchestrator.executors.stacks import StackDumps
from orchestrator.scheduler import watchdog
from orchestrator.scheduler.admission import Admission, current_attempt
from orchestrator.scheduler.attempts import environment, launch, prepare, stop
from orchestrator.scheduler.energy import EnergyMeter
from orchestrator.scheduler.outcomes import attempt_config, settle
from orchestrator.scheduler.repeats import RepeatedErrors, signature
from orchestrator.scheduler.storage import StorageFaults, is_storage_text, sqlite_folder
from orchestrator.scripts.attempt_watch import ScriptWatch

logger = logging.getLogger(__name__)

TICK_S = 0.5
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
        self.energy = EnergyMeter(sessions, inventory, host=self.host)  # tests give it a stand-in NVML
        self.scripts = ScriptWatch()
        self._heartbeat_id: int | None = None
        self._heartbeat_new = False  # the row was inserted by a commit still to come
        self._beat_at = -math.inf
        self._started_at = time.time()
        # The exit files of the local attempts the last tick saw alive: a file appearing there
        # wakes the tick at once (add_jobs' ``wake``) instead of up to a tick later (issue 32).
        self.watched_exits: frozenset[Path] = frozenset()
        self._alive_exits: set[Path] = set()
        self.settled = 0  # attempts settled: a tick that settled one brings the sweeps job forward (service.py)
        self._errors = RepeatedErrors(logger)
        # A full disk or a read-only mount: one line when it starts and one when it is over.
        self.storage = StorageFaults(logger, database_folder=sqlite_folder(settings.db_url))
        self._file = SchedulerFile(settings.scheduler_file)
        self._file_at = -math.inf
        self._published_inventory = inventory.to_json()  # fixed for the process's life
        self._db_problem: str | None = None
        self._db_problem_since: float | None = None

    def close(self) -> None:
        """Stop the stack-dump pool (dumps in flight finish in the background)."""
        self.dumps.close()
        self._file.close()
        self.energy.close()

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
        self.storage.check()
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
            if not self.storage.failed(where, exc):  # a storage fault is told once, not per tick
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
            if self.storage.failed(where, exc):
                return  # its rows could not be written: told once with the storage fault
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
            # A storage fault has its own two lines (self.storage), however often writes pass meanwhile.
            if problem and not is_storage_text(problem):
                logger.error("the database is not writable: %s; runs are not being updated", problem)
            elif not problem and not is_storage_text(self._db_problem):
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
        """Launch the run's next attempt, if this scheduler wins the run: prepare (win it, write the
        attempt's row), environment, launch (orchestrator/scheduler/attempts.py)."""
        prepared = prepare(session, run, devices, self.executors, self.inventory, self._heartbeat_id)
        if prepared is not None:
            self.energy.start(session, run, prepared.attempt)  # the baseline, before anything of it runs
            launch(session, prepared, environment(prepared, self.settings.db_url, self.inventory))

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
            stop(session, run, attempt, executor, config.supervision.grace_s)
        elif not executor.queued(attempt):
            script = config.workload.kind == "script"
            output_at = self.scripts.output_at(run.id, attempt.number) if script else None
            watchdog.check(session, run, attempt, config.supervision, script=script, dumps=self.dumps,
                           executor=executor, output_at=output_at, storage=self.storage)
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
        config = attempt_config(run, attempt)  # once: the script watcher and every rule of the settling use it
        if config.workload.kind == "script":
            self._script_step(session, run, attempt, "finish",
                              partial(self.scripts.finish, session, run, attempt, config))
            self.scripts.forget(run.id, attempt.number)  # finished, or failed: settled either way
        self.energy.end(session, run, attempt)  # its processes are gone: the last reading
        settle(session, run, attempt, exited, storage=self.storage.seen_since(attempt.started_at), config=config)
        self.settled += 1
