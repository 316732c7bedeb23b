"""What an ended attempt's folder says about its end: the ranks' graceful stop (``stopped.json``),
the agent's first sight of a failed rank (``failure.json``), the ranks' notes that their work was
done (``finished/``), and the diagnosis of a failure, from the most specific evidence down: the
hang watchdog's word, the agent's own death by a signal, a stop from outside, Slurm's final state,
a launcher that vanished, the ranks' logs (orchestrator/scheduler/failures.py); and the storage's
part in it. orchestrator/scheduler/outcomes.py settles the attempt with what these find.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from db.models import Attempt, Run
from db.states import StopReason
from db.vocabulary.causes import Cause
from db.vocabulary.config import RunConfig
from db.vocabulary.layout import AttemptPaths
from orchestrator.scheduler.failures import Failure, agent_killed, classify, rank_failures, signal_name, stderr_tail
from orchestrator.scheduler.storage import (
    StorageFault,
    deleted_message,
    disk_detail,
    run_dir_deleted,
    writable_problem,
)
from orchestrator.scheduler.watchdog import HANDLER_DEADLOCK


def read_stopped(attempt_dir: Path) -> dict[str, Any] | None:
    """The ranks' note that they stopped gracefully at a SIGTERM (its step), or None."""
    try:
        stopped: dict[str, Any] | None = json.loads(AttemptPaths(attempt_dir).stopped.read_text())
        return stopped
    except (OSError, ValueError):
        return None


def first_failure_at(attempt_dir: Path) -> float | None:
    """When torchrun's agent first saw a rank fail (``failure.json``, trainer/agent/torchrun.py), or None."""
    try:
        return float(json.loads(AttemptPaths(attempt_dir).failure_file.read_text())["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def finished_ranks(attempt_dir: Path) -> set[int]:
    """Ranks that left the note that their work is done (trainer/process/lifecycle.py's write_finished)."""
    folder = AttemptPaths(attempt_dir).finished
    return {int(p.stem.removeprefix("rank-")) for p in folder.glob("rank-*.json")} if folder.is_dir() else set()


def died_after_finishing(attempt: Attempt, config: RunConfig) -> str | None:
    """When every rank had finished its work (metrics flushed, last checkpoint durable) and the
    only failures are deaths by a signal, the attempt succeeded: a rank that aborts in the
    interpreter's shutdown (C++ destructors of the process group's threads race it now and
    then) has lost nothing, and retrying would redo finished work. ``config``: the attempt's.
    Returns the warning to record, or None when the attempt really failed."""
    if attempt.stop_reason is not None:
        return None
    attempt_dir = Path(attempt.dir)
    if finished_ranks(attempt_dir) != set(range(config.launch.world_size)):
        return None
    failures = rank_failures(attempt_dir)
    if not failures or any(f.message or f.exitcode is None or f.exitcode >= 0 for f in failures):
        return None
    deaths = ", ".join(f"rank {f.rank} by {signal_name(f.exitcode)}" for f in failures if f.exitcode is not None)
    return (f"every rank had finished its work, then the processes died in shutdown ({deaths}); "
            "nothing was lost, so the attempt counts as a success")


def diagnose(attempt: Attempt, exited: dict[str, Any] | None, stopped: dict[str, Any] | None) -> Failure:
    """What ended a failed attempt, from the most specific evidence down (the module's docstring)."""
    code = attempt.exit_code
    if attempt.stop_reason == StopReason.HANG:
        return _hang(attempt, exited)
    if exited is not None and code is not None and code < 0:
        # torchrun's agent itself died of a signal that runyard did not send (runyard's own stops
        # are settled before this): whatever its ranks did after (a SIGTERM forwarded from
        # elsewhere may have let them checkpoint), this is a failure that spends a retry, not a
        # preemption; a fault that repeats must not retry for ever.
        return agent_killed(Path(attempt.dir), code, exited.get("pid"))
    if stopped is not None:
        who = ("Slurm's warning signal (time limit or preemption)" if exited and exited.get("warned")
               else "SIGTERM from outside runyard")
        return Failure(Cause.PREEMPTED, None,
                       f"{who} at step {stopped.get('step')}; checkpoint at step {stopped.get('checkpoint_step')}",
                       "", "SIGTERM")
    slurm_failure = _slurm_ended(attempt, exited)
    if slurm_failure is not None:
        return slurm_failure
    if exited is None:
        return Failure(Cause.VANISHED, None,
                       "the launcher vanished without an exit code (killed, or the host restarted)", "")
    return classify(Path(attempt.dir), code)


def _hang(attempt: Attempt, exited: dict[str, Any] | None) -> Failure:
    """runyard killed every rank, so the exit codes say nothing about which one hung: the rank is
    the one the stacks named when the hang was detected (orchestrator/scheduler/watchdog.py)."""
    base = classify(Path(attempt.dir), attempt.exit_code) if exited else None
    if attempt.cause == Cause.USER_ERROR.value:
        # The stacks found the named rank waiting inside its exception handler (watchdog.py).
        return Failure(Cause.USER_ERROR, attempt.failed_rank, attempt.exception,
                       stderr_tail(Path(attempt.dir), attempt.failed_rank), detail=HANDLER_DEADLOCK)
    return Failure(Cause.HANG, attempt.failed_rank,
                   f"no progress after step {attempt.last_step or 0}; stacks in {Path(attempt.dir) / 'stacks'}",
                   base.log_tail if base else "")


# What Slurm's final job state means when the job left no exit marker (orchestrator/executors/slurm/executor.py).
_SLURM_CAUSES = {"PREEMPTED": Cause.PREEMPTED, "TIMEOUT": Cause.PREEMPTED, "NODE_FAIL": Cause.NODE_FAIL,
                 "BOOT_FAIL": Cause.NODE_FAIL, "OUT_OF_MEMORY": Cause.OOM_KILLED}


def _slurm_ended(attempt: Attempt, exited: dict[str, Any] | None) -> Failure | None:
    """The failure Slurm's own word gives for a job that ended without writing its exit marker
    (killed at the time limit, preempted, a node lost), or None."""
    state = exited.get("slurm_state") if exited else None
    if state == "PENDING" and exited:
        reason = exited.get("slurm_reason")
        why = (f"Slurm would never start job {attempt.job_id}: it pended with reason {reason} (more nodes, time or "
               "resources than the partition allows, or an account or QOS not yours); cancelled. Change launch.nnodes "
               "or the [slurm] settings (sinfo shows the partitions)")
        return Failure(Cause.LAUNCH_FAILED, None, why, "")
    cause = _SLURM_CAUSES.get(str(state))
    if cause is None:
        return None
    job = f"Slurm job {attempt.job_id}"
    if cause is Cause.PREEMPTED:
        return Failure(cause, None, f"{job} ended {state} before its ranks could checkpoint; resuming from the newest "
                                    "checkpoint", "")
    return Failure(cause, None, f"{job} ended {state}", stderr_tail(Path(attempt.dir), None))


# Diagnoses a storage fault at the attempt's end explains better: the ranks' own evidence (their
# logs, their error files) was lost with the writes that failed.
_STORAGE_EXPLAINS = frozenset({Cause.UNKNOWN, Cause.USER_ERROR, Cause.SIGNAL, Cause.VANISHED})


def storage_failure(run: Run, attempt: Attempt, exited: dict[str, Any] | None, diagnosed: Failure,
                    seen: StorageFault | None = None) -> Failure | None:
    """The storage's part in the attempt's end, or None: the run folder deleted under it
    (``RUN_DIR_DELETED``, never retried), or a ``DISK`` failure when the launcher could not write
    its exit file (it says so in the record it wrote late, or there is no record and the attempt's
    folder cannot be written now), or when the ranks ended with an exit code and no traceback (it
    could not be written) while the attempt's folder cannot be written now or a storage fault was
    ``seen`` meanwhile, naming the path and the errno."""
    run_dir = Path(run.run_dir)
    if run_dir_deleted(run_dir):
        return Failure(Cause.RUN_DIR_DELETED, None, deleted_message(run_dir), "")
    if diagnosed.cause not in _STORAGE_EXPLAINS or attempt.stop_reason is not None:
        return None
    error = exited.get("storage_error") if exited else None
    if isinstance(error, dict):
        text = f"the launcher could not write its exit file for a while: {error.get('message')}"
    elif exited is None and (problem := writable_problem(Path(attempt.dir))) is not None:
        text = f"the launcher ended without an exit file: [Errno {problem.errno}] {problem.strerror}: '{problem.path}'"
    elif diagnosed.cause is Cause.UNKNOWN and (problem := writable_problem(Path(attempt.dir)) or seen) is not None:
        text = (f"{diagnosed.exception} and no traceback, while the storage could not be written: "
                f"[Errno {problem.errno}] {problem.strerror}: '{problem.path}'")
    else:
        return None
    return Failure(Cause.DISK, None, text, diagnosed.log_tail, detail=disk_detail(text, Path(attempt.dir)))
