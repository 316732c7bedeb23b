"""The Slurm executor: one batch job per attempt, one ``srun`` task per node running torchrun.

runyard, not Slurm, decides retries by cause: jobs are submitted with ``--no-requeue``, and a
preempted, timed-out or failed attempt becomes a new job (a new attempt, its own logs) chosen by
the scheduler's retry policy. The job's batch program (orchestrator/executors/slurm/job.py) writes the
exit marker; the run's folder must be on a filesystem the compute nodes share with the
scheduler's machine.

Status, most direct first: ``squeue`` (one call for every job, at most every
``RUNYARD_SLURM_POLL_S`` seconds: the controller is shared), the exit marker once the job has
left the queue, ``sacct`` where accounting runs. A job that left the queue with neither is
*unknown*, not failed: it waits (``UNKNOWN_GIVE_UP_S``) for the marker (a shared filesystem may
show it late) or accounting, and only then is settled as vanished (retried like a lost process).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from db.models import Attempt, Event, Run
from db.vocabulary.layout import LAUNCHER_LOG, AttemptPaths
from db.vocabulary.settings import EnvSettings
from orchestrator.executors.base import ExecutorError, LaunchRequest, Liveness, Observation
from orchestrator.executors.launcher import entry_argv, rdzv_id, warm_start
from orchestrator.executors.processes import read_exit
from orchestrator.executors.slurm.commands import (
    ACTIVE_STATES,
    NEVER_STARTS,
    QUEUED_JOB_STATES,
    JobStatus,
    Slurm,
    SlurmError,
)
from orchestrator.executors.slurm.job import program
from orchestrator.executors.slurm.node import stacks_file
from orchestrator.executors.stack_reading import RankStack
from orchestrator.executors.stacks import StackDump

logger = logging.getLogger(__name__)

# A job shown finished by squeue but without its exit marker yet: the marker is waited for this
# long (the batch program writes it last; a shared filesystem may show it late).
MARKER_WAIT_S = 30.0
# A job gone from the queue with no marker and no accounting is unknown this long, then lost.
UNKNOWN_GIVE_UP_S = 600.0
# Slurm's warning signal comes at least this long before the time limit (plus the run's
# measured checkpoint time): time to finish a step and save.
WARNING_MARGIN_S = 30
WARNING_MIN_S = 90
# Stack dumps: how long the nodes get to write theirs.
STACKS_WAIT_S = 20.0


def poll_interval_s() -> float:
    """RUNYARD_SLURM_POLL_S (db/vocabulary/settings.py, default 5 s; the scheduler checked it when it started)."""
    return EnvSettings.from_env().slurm_poll_s


def warning_lead_s(checkpoint_s: float | None) -> int:
    """Seconds before the time limit that Slurm sends the warning: the run's longest measured
    checkpoint plus WARNING_MARGIN_S, at least WARNING_MIN_S (Slurm takes up to 65535)."""
    measured = int(checkpoint_s or 0) + WARNING_MARGIN_S
    return min(65535, max(WARNING_MIN_S, measured))


def job_name(run_id: int, number: int, home: str) -> str:
    """``runyard-r42-a3-1a2b3c``: the run and attempt, and a tag of the data folder (two
    installations of runyard on one cluster never take each other's jobs)."""
    tag = hashlib.sha256(home.encode()).hexdigest()[:6]
    return f"runyard-r{run_id}-a{number}-{tag}"


def sbatch_options(request: LaunchRequest, name: str, lead_s: int) -> list[str]:
    """sbatch's options for one attempt: runyard's own, then the ``[slurm]`` fields, then
    ``slurm.sbatch_args`` (validated: none of them may repeat runyard's)."""
    launch, slurm = request.config.launch, request.config.slurm
    argv = [f"--job-name={name}", f"--chdir={request.cwd}",
            f"--output={request.attempt_dir / LAUNCHER_LOG}", "--open-mode=append",
            f"--signal=B:USR2@{lead_s}", f"--nodes={launch.nnodes}", "--ntasks-per-node=1", "--no-requeue",
            "--export=ALL"]
    fields = (("--partition", slurm.partition), ("--account", slurm.account), ("--time", slurm.time_limit),
              ("--gpus-per-node", slurm.gpus_per_node), ("--cpus-per-task", slurm.cpus_per_task),
              ("--mem", slurm.mem))
    argv += [f"{option}={value}" for option, value in fields if value]  # unset or 0: the partition's default
    return [*argv, *slurm.sbatch_args]


class SlurmExecutor:
    """Attempts as Slurm batch jobs."""

    name = "slurm"

    def __init__(self, home: str, slurm: Slurm | None = None, poll_s: float | None = None):
        self.home = home
        self.slurm = slurm or Slurm()
        self.poll_s = poll_s if poll_s is not None else poll_interval_s()
        self._jobs: dict[str, JobStatus] = {}  # this user's jobs at the last good squeue
        self._polled_at: float | None = None  # when that was
        self._tried_at = -1e18
        self._poll_error: str | None = None
        self._gone_since: dict[str, float] = {}  # job id -> when it was first missed
        self._lingering: set[str] = set()

    # -- launch ---------------------------------------------------------------------------

    def submit(self, request: LaunchRequest, attempt: Attempt) -> str:
        config = request.config
        request.attempt_dir.mkdir(parents=True, exist_ok=True)
        args = {"run_id": request.run_id, "attempt": request.number, "attempt_dir": str(request.attempt_dir),
                "run_dir": str(request.cwd), "nnodes": config.launch.nnodes,
                "nproc_per_node": config.launch.nproc_per_node, "rdzv_id": rdzv_id(request.run_id, request.number),
                "entry": entry_argv(config, request.resuming), "warm": warm_start(config)}
        batch = request.attempt_dir / "job.py"
        batch.write_text(program(args, EnvSettings.from_env().slurm_python or sys.executable))
        batch.chmod(0o700)
        lead = warning_lead_s(request.checkpoint_s)
        name = job_name(request.run_id, request.number, self.home)
        env = {**os.environ, **request.env, "PYTHONUNBUFFERED": "1"}
        try:
            job_id = self.slurm.sbatch([*sbatch_options(request, name, lead), str(batch)], env)
        except SlurmError as exc:
            raise ExecutorError(f"sbatch refused the job: {exc}") from None
        attempt.job_id, attempt.job_state, attempt.job_state_at = job_id, "PENDING", time.time()
        where = f", partition {config.slurm.partition}" if config.slurm.partition else ""
        return (f"Slurm job {job_id} ({config.launch.nnodes} node(s) x {config.launch.nproc_per_node} rank(s)"
                f"{where}; warning signal {lead} s before its time limit)")

    # -- status ---------------------------------------------------------------------------

    def poll(self, attempts: Sequence[Attempt]) -> None:
        """One ``squeue`` for every job of this user, at most every ``poll_s``; a failure keeps
        the last known states (their age shows) and concludes nothing."""
        if not attempts:
            return
        now = time.time()
        if now - self._tried_at < self.poll_s:
            return
        self._tried_at = now
        try:
            self._jobs = self.slurm.squeue()
        except SlurmError as exc:
            if str(exc) != self._poll_error:
                logger.warning("squeue failed: %s; the Slurm runs keep their last known state", exc)
            self._poll_error = str(exc)
            return
        self._poll_error = None
        self._polled_at = now
        for attempt in attempts:
            job = self._jobs.get(attempt.job_id or "")
            if job is None:
                continue
            self._gone_since.pop(job.job_id, None)
            submitted = attempt.started_at
            if _record(attempt, job.state, job.reason, job.nodes, now):
                session = object_session(attempt)
                if session is not None:
                    session.add(Event(run_id=attempt.run_id, attempt=attempt.number, at=now, kind="slurm",
                                      message=f"Slurm job {job.job_id} started on {job.nodes or 'its nodes'} after "
                                              f"{now - submitted:.0f} s in the queue"))

    def observe(self, session: Session, run: Run, attempt: Attempt) -> Observation:
        marker = read_exit(Path(attempt.dir))
        job = self._jobs.get(attempt.job_id or "")
        fresh = self._polled_at is not None and self._polled_at > attempt.started_at
        if marker is not None and (job is None or job.state not in ACTIVE_STATES or job.state == "COMPLETING"):
            return Observation(Liveness.ENDED, self._with_canceller(marker, attempt))
        if attempt.job_id is None:
            return Observation(Liveness.VANISHED)
        if fresh and job is not None and job.state == "PENDING" and job.reason in NEVER_STARTS:
            return self._never_starts(session, run, attempt, job)
        if not fresh or (job is not None and job.state in ACTIVE_STATES):
            return Observation(Liveness.ALIVE)
        now = time.time()
        since = self._gone_since.setdefault(attempt.job_id, now)
        if job is not None:  # squeue still shows it finished (MinJobAge): the marker should follow
            if now - since < MARKER_WAIT_S:
                return Observation(Liveness.UNSETTLED)
            return Observation(Liveness.ENDED, self._with_canceller(_from_slurm(job, attempt), attempt))
        accounted = self.slurm.sacct_state(attempt.job_id)
        if accounted is not None and accounted.state not in ACTIVE_STATES:
            _record(attempt, accounted.state, accounted.reason, accounted.nodes, now)
            return Observation(Liveness.ENDED, _from_slurm(accounted, attempt))
        if now - since < UNKNOWN_GIVE_UP_S:
            reason = (f"left Slurm's queue {now - since:.0f} s ago without an exit marker, and accounting does not "
                      "know it; waiting for the marker or sacct")
            if attempt.job_state != "UNKNOWN":
                _record(attempt, "UNKNOWN", reason, attempt.job_nodes or "", now)
                session.add(Event(run_id=run.id, attempt=attempt.number, at=now, level="warning", kind="slurm",
                                  message=f"Slurm job {attempt.job_id} {reason}"))
            return Observation(Liveness.UNSETTLED)
        self._gone_since.pop(attempt.job_id, None)
        return Observation(Liveness.VANISHED)

    def _with_canceller(self, record: dict[str, Any], attempt: Attempt) -> dict[str, Any]:
        """``record`` with who cancelled the job (``cancelled_by``), asked of accounting once, when
        the job was cancelled by a person (a plain ``scancel``: orchestrator/scheduler/outcomes.py's
        ``cancelled_in_slurm``) and accounting runs; unchanged otherwise."""
        if (cancelled_in_slurm(record) is None or "cancelled_by" in record or attempt.job_id is None
                or attempt.stop_reason is not None):
            return record
        accounted = self.slurm.sacct_state(attempt.job_id)
        return {**record, "cancelled_by": accounted.cancelled_by if accounted is not None else None}

    def _never_starts(self, session: Session, run: Run, attempt: Attempt, job: JobStatus) -> Observation:
        """A job Slurm will never start as submitted (PartitionNodeLimit...): cancelled, and the
        attempt ended as a failed launch that no retry can mend."""
        try:
            self.slurm.scancel(job.job_id)
        except SlurmError as exc:
            logger.warning("run %d: scancel of job %s failed: %s", run.id, job.job_id, exc)
            return Observation(Liveness.ALIVE)  # try again next tick
        return Observation(Liveness.ENDED, {
            "exit_code": 1, "pid": None, "started_at": attempt.started_at, "ended_at": time.time(),
            "job_id": job.job_id, "slurm_state": "PENDING", "slurm_reason": job.reason, "marker": False})

    def has_handle(self, attempt: Attempt) -> bool:
        return attempt.job_id is not None

    def adopt(self, session: Session, run: Run, attempt: Attempt) -> None:
        """A job submitted by a scheduler that died before committing its id: found by its name."""
        name = job_name(run.id, attempt.number, self.home)
        try:
            found = self.slurm.squeue(name=name)
        except SlurmError:
            return
        marker = read_exit(Path(attempt.dir))
        job_id = next(iter(found), None) or (str(marker["job_id"]) if marker and marker.get("job_id") else None)
        if job_id is None:
            return
        attempt.job_id = job_id
        message = (f"attempt {attempt.number}: its Slurm job id was never committed (the scheduler stopped during "
                   f"the submit); adopted job {job_id} by its name {name}")
        session.add(Event(run_id=run.id, attempt=attempt.number, at=time.time(), kind="launch", message=message))
        logger.info("run %d: %s", run.id, message)

    def ranks_running(self, run: Run, attempt: Attempt) -> bool:
        return attempt.job_state == "RUNNING"

    def queued(self, attempt: Attempt) -> bool:
        return attempt.job_state in QUEUED_JOB_STATES

    # -- stopping -------------------------------------------------------------------------

    def terminate(self, run: Run, attempt: Attempt) -> bool:
        """SIGTERM to every process of the job's steps; a job still pending is cancelled (it has
        nothing to save)."""
        if attempt.job_id is None:
            return False
        try:
            if attempt.job_state == "PENDING":
                self.slurm.scancel(attempt.job_id)
            else:
                self.slurm.scancel(attempt.job_id, signal_name="TERM")
        except SlurmError as exc:
            logger.warning("run %d: scancel of job %s failed: %s", run.id, attempt.job_id, exc)
            return False
        return True

    def kill(self, run: Run, attempt: Attempt) -> None:
        if attempt.job_id is None:
            return
        try:
            self.slurm.scancel(attempt.job_id, signal_name="KILL", full=True)
        except SlurmError as exc:
            logger.info("run %d: scancel --signal=KILL of job %s: %s", run.id, attempt.job_id, exc)
        try:
            self.slurm.scancel(attempt.job_id)
        except SlurmError as exc:
            logger.warning("run %d: scancel of job %s failed: %s", run.id, attempt.job_id, exc)

    def end_older(self, run: Run, attempt: Attempt) -> None:
        for older in run.attempts:
            job = self._jobs.get(older.job_id or "")
            if older.number < attempt.number and job is not None and job.state in ACTIVE_STATES:
                self.kill(run, older)

    def sweep(self, session: Session, run: Run, number: int, attempt: Attempt | None) -> bool:
        """True once the attempt's job is out of Slurm's queue (or finished in it); a job still
        there is cancelled, and the run waits."""
        if attempt is None:
            attempt = session.scalar(select(Attempt).where(Attempt.run_id == run.id, Attempt.number == number))
        if attempt is None or attempt.job_id is None:
            return True
        try:
            jobs = self.slurm.squeue(name=job_name(run.id, number, self.home))
        except SlurmError as exc:
            logger.warning("run %d: squeue failed while making sure job %s ended: %s", run.id, attempt.job_id, exc)
            return False
        job = jobs.get(attempt.job_id)
        if job is None or job.state not in ACTIVE_STATES or (job.state == "COMPLETING" and not job.nodes):
            self._lingering.discard(attempt.job_id)
            return True
        self.kill(run, attempt)
        if attempt.job_id not in self._lingering:
            self._lingering.add(attempt.job_id)
            session.add(Event(run_id=run.id, attempt=number, at=time.time(), level="warning", kind="exit",
                              message=f"attempt {number}: Slurm job {attempt.job_id} is still {job.state} after "
                                      "its attempt ended; cancelled; the run waits until it leaves the queue"))
        return False

    def stack_dump(self, run: Run, attempt: Attempt) -> Callable[[], StackDump]:
        job_id, attempt_dir, nnodes = attempt.job_id, Path(attempt.dir), _nnodes(run)

        def dump() -> StackDump:
            folder = AttemptPaths(attempt_dir).stacks
            folder.mkdir(parents=True, exist_ok=True)
            asked = time.time()
            if job_id is None:
                raise ExecutorError("the attempt has no Slurm job yet")
            self.slurm.scancel(job_id, signal_name="USR1")
            ranks: list[RankStack] = []
            deadline = time.monotonic() + STACKS_WAIT_S
            while time.monotonic() < deadline:
                summaries = [_read_json(stacks_file(attempt_dir, n)) for n in range(nnodes)]
                if all(s is not None and float(s.get("at", 0)) >= asked for s in summaries):
                    ranks = [RankStack(**r) for s in summaries if s for r in s.get("ranks", [])]
                    break
                time.sleep(0.5)
            return StackDump(folder=folder, files=sorted(folder.iterdir()), ranks=sorted(ranks, key=lambda r: r.rank))

        return dump


def _record(attempt: Attempt, state: str, reason: str, nodes: str, now: float) -> bool:
    """Keep Slurm's view on the attempt row (the Run page shows it, with its age); written when
    it changes, and refreshed at most every 30 s otherwise.

    When the job leaves the queue for its allocation, the attempt's start moves to that moment:
    time waiting in the queue holds no allocation, so it is neither charged (cost), nor counted
    against the start-up timeout (watchdog), nor in the run's goodput. Returns True then.
    """
    started = attempt.job_state in (*QUEUED_JOB_STATES, None) and state in ACTIVE_STATES \
        and state not in QUEUED_JOB_STATES
    if started:
        attempt.started_at = now
    changed = (attempt.job_state, attempt.job_reason, attempt.job_nodes) != (state, reason, nodes or None)
    if changed or attempt.job_state_at is None or now - attempt.job_state_at >= 30.0:
        attempt.job_state, attempt.job_reason, attempt.job_nodes = state, reason, nodes or None
        attempt.job_state_at = now
    return started


def _from_slurm(job: JobStatus, attempt: Attempt) -> dict[str, Any]:
    """An exit record made from Slurm's word alone (no marker): its state and exit code (and who
    cancelled it, where accounting says)."""
    code = job.exit_code if job.exit_code is not None else (0 if job.state == "COMPLETED" else 1)
    record = {"exit_code": code, "pid": None, "started_at": attempt.started_at, "ended_at": time.time(),
              "job_id": job.job_id, "slurm_state": job.state, "marker": False}
    if job.cancelled_by is not None:
        record["cancelled_by"] = job.cancelled_by
    return record


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _nnodes(run: Run) -> int:
    try:
        return int(json.loads(run.config_json).get("launch", {}).get("nnodes") or 1)
    except ValueError:
        return 1

def cancelled_in_slurm(exited: dict[str, Any] | None) -> str | None:
    """How a person cancelled the attempt's Slurm job, in words, or None when no one did.

    A plain ``scancel`` of the job (by its owner or an administrator) sends the batch program
    and every rank SIGTERM, as Slurm's time limit and preemption do; slurmstepd's line in the
    job's output tells them apart (orchestrator/executors/slurm/job.py's ``stop_line``: no ``DUE TO``), and
    Slurm's final state does when the job left no marker (``CANCELLED``, where a time limit is
    ``TIMEOUT`` and a preemption ``PREEMPTED``). Asked only of an attempt runyard did not stop
    itself (no stop reason: its cancel, pause and hang kill also end in ``scancel``); the warning
    signal (USR2) is never a cancel.
    """
    if not exited:
        return None
    stop = exited.get("slurm_stop")
    by = exited.get("cancelled_by")
    who = f" by {by}" if by else ""
    job = f"Slurm job {exited.get('job_id')}" if exited.get("job_id") else "the Slurm job"
    if isinstance(stop, dict) and exited.get("terminated") and not stop.get("due_to"):
        return f"{job} was cancelled with scancel{who} at {stop.get('at')} (on {stop.get('node')})"
    if exited.get("marker") is False and exited.get("slurm_state") == "CANCELLED":
        return f"{job} ended CANCELLED in Slurm{who} (a scancel outside runyard)"
    return None
