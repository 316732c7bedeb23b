"""What an ended attempt means for its run: success, a stop runyard asked for (cancel, pause),
or a failure that is classified and handed to the retry policy.

Every attempt keeps its evidence for the timeline: cause, first failing rank, exception line,
log tail, steps lost since the last checkpoint, and when it failed and was detected.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.models import Attempt, Checkpoint, Event, Run
from db.states import STOPPING, AttemptStatus, RunStatus, SignalSent, StopReason, attempt_transition, transition
from db.vocabulary.causes import Cause
from db.vocabulary.config import RunConfig, config_from_json, deep_merge
from db.vocabulary.layout import AttemptPaths
from orchestrator.executors.slurm.executor import cancelled_in_slurm
from orchestrator.scheduler.failures import (
    Failure,
    agent_killed,
    classify,
    disk_detail,
    rank_failures,
    signal_name,
    stderr_tail,
)
from orchestrator.scheduler.retry import AttemptOutcome, Decision, backoff_s, decide, halved_micro_batch, same_exception
from orchestrator.scheduler.storage import deleted_message, run_dir_deleted, storage_fault, writable_problem
from orchestrator.scripts.checkpoint_loads import refuse_unloadable

logger = logging.getLogger(__name__)

def read_stopped(attempt_dir: Path) -> dict[str, Any] | None:
    try:
        stopped: dict[str, Any] | None = json.loads(AttemptPaths(attempt_dir).stopped.read_text())
        return stopped
    except (OSError, ValueError):
        return None


def attempt_config(run: Run, attempt: Attempt) -> RunConfig:
    """The config an attempt ran with: the run's, plus the attempt's overrides."""
    overrides = json.loads(attempt.overrides_json or "{}")
    base = config_from_json(run.config_json)
    return RunConfig.model_validate(deep_merge(base.as_dict(), overrides)) if overrides else base


def next_overrides(run: Run, previous: Attempt | None) -> dict[str, Any]:
    """Overrides for the next attempt: the previous attempt's, adjusted after a CUDA OOM."""
    if previous is None:
        return {}
    overrides: dict[str, Any] = json.loads(previous.overrides_json or "{}")
    if previous.cause == Cause.CUDA_OOM.value:
        train = attempt_config(run, previous).train
        overrides = deep_merge(overrides, halved_micro_batch(train.batch_size, train.grad_accum))
    return overrides


def _last_checkpoint(session: Session, attempt: Attempt) -> int | None:
    """The step of the attempt's newest own checkpoint, else the step it started from. A version
    it recorded but refused is not its own: a file that was in the working folder before the run
    (another run's ``ckpt.pt`` at iteration 1500 made a run paused at step 70 lose "0 steps"), a
    truncated or incomplete one."""
    own = session.scalar(
        select(func.max(Checkpoint.step))
        .where(Checkpoint.run_id == attempt.run_id, Checkpoint.attempt == attempt.number,
               Checkpoint.refused_reason.is_(None))
    )
    return own if own is not None else attempt.resume_step


def first_failure_at(attempt_dir: Path) -> float | None:
    """When torchrun's agent first saw a rank fail (``failure.json``, trainer/agent/torchrun.py), or None."""
    try:
        return float(json.loads(AttemptPaths(attempt_dir).failure_file.read_text())["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _record(session: Session, attempt: Attempt, exited: dict[str, Any] | None, now: float) -> None:
    attempt.exit_code = int(exited["exit_code"]) if exited else None
    attempt.ended_at = float(exited["ended_at"]) if exited else now
    # The rank's failure, as the agent saw it, before it stopped the other ranks; else the exit.
    seen = first_failure_at(Path(attempt.dir)) if attempt.exit_code else None
    attempt.failed_at = min(seen, attempt.ended_at) if seen is not None else attempt.ended_at
    attempt.detected_at = now
    attempt.last_checkpoint_step = _last_checkpoint(session, attempt)
    reached = attempt.last_step if attempt.last_step is not None else (attempt.resume_step or 0)
    attempt.steps_lost = max(0, reached - (attempt.last_checkpoint_step or 0))


def _event(session: Session, run: Run, attempt: Attempt, level: str, message: str) -> None:
    session.add(Event(run_id=run.id, attempt=attempt.number, at=time.time(), level=level, kind="exit", message=message))
    logger.info("run %d attempt %d: %s", run.id, attempt.number, message)


def stop_mode(run: Run, attempt: Attempt) -> StopReason:
    """How a stopped attempt's run ends: PAUSING pauses; CANCELLING ends as its request says (a
    cancel asked for while pausing turns ``runs.stop_mode`` into a cancel after the attempt's
    SIGTERM was sent as a pause); otherwise the reason the attempt was stopped for."""
    status = RunStatus(run.status)
    if status is RunStatus.PAUSING:
        return StopReason.PAUSE
    if status is RunStatus.CANCELLING and run.stop_mode:
        return StopReason(run.stop_mode)
    return StopReason(attempt.stop_reason or StopReason.CANCEL)


def settle(session: Session, run: Run, attempt: Attempt, exited: dict[str, Any] | None,
           now: float | None = None) -> None:
    """The attempt's processes are gone: record how it ended and move the run on."""
    now = time.time() if now is None else now
    attempt_dir = Path(attempt.dir)
    stopped = read_stopped(attempt_dir)
    _record(session, attempt, exited, now)
    code = attempt.exit_code

    if (attempt.stop_reason in (StopReason.CANCEL, StopReason.PAUSE) and code == 0 and stopped is None
            and run.max_steps and (attempt.last_step or 0) >= run.max_steps):
        # The ranks had trained every step and were finishing (the final save, the teardown)
        # when the cancel or pause arrived: they ended on their own, and the run is done.
        asked = "pause" if attempt.stop_reason == StopReason.PAUSE else "cancel"
        finished = f"all ranks finished (step {attempt.last_step}/{run.max_steps}) before the {asked} took effect"
        attempt_transition(attempt, AttemptStatus.SUCCEEDED, finished)
        transition(session, run.id, RunStatus.SUCCEEDED, finished)
        _event(session, run, attempt, "info", finished)
        return
    if attempt.stop_reason in (StopReason.CANCEL, StopReason.PAUSE) or (
            RunStatus(run.status) in STOPPING and exited is None):
        mode = stop_mode(run, attempt)
        attempt_transition(attempt, AttemptStatus.PAUSED if mode is StopReason.PAUSE else AttemptStatus.CANCELLED)
        ckpt = (f"last checkpoint at step {attempt.last_checkpoint_step}" if attempt.last_checkpoint_step
                else "no checkpoint")
        how = "with a checkpoint" if stopped else f"killed with {attempt.signal_sent or 'a signal'}"
        if stopped and code and attempt.signal_sent not in (None, SignalSent.SIGKILL):
            # The ranks checkpointed and stopped as asked; torchrun's agent, which got the same
            # signal, answers it with a non-zero exit of its own: not the ranks' failure.
            how += f"; torchrun's exit {code} was its answer to the {attempt.signal_sent}"
            attempt.exit_code = 0
        if mode is StopReason.PAUSE:
            attempt.reason = f"paused at step {attempt.last_step or 0} ({how}); {ckpt}; Resume continues from it"
        else:
            attempt.reason = f"cancelled at step {attempt.last_step or 0} ({how}); {ckpt}"
        transition(session, run.id, RunStatus.PAUSED if mode is StopReason.PAUSE else RunStatus.CANCELLED,
                   attempt.reason)
        _event(session, run, attempt, "info", attempt.reason)
        return
    shutdown_crash = died_after_finishing(run, attempt) if code and stopped is None and exited else None
    if (code == 0 or shutdown_crash) and stopped is None:
        finished = "all ranks finished"
        if attempt.last_step is None and attempt_config(run, attempt).workload.kind == "script":
            finished = ("all ranks exited 0, but the script reported no step: runyard cannot tell that it trained "
                        "(no SDK step, RUNYARD line, workload.stdout_metrics match or TensorBoard scalar); check "
                        "its logs")
            _event(session, run, attempt, "warning", finished)
        attempt_transition(attempt, AttemptStatus.SUCCEEDED, finished)
        transition(session, run.id, RunStatus.SUCCEEDED, finished)
        if shutdown_crash:
            _event(session, run, attempt, "warning", shutdown_crash)
        _event(session, run, attempt, "info", f"attempt {attempt.number} succeeded")
        return

    # Before the failure's causes: the ranks' checkpoint at its SIGTERM must not read as a preemption.
    by_person = cancelled_in_slurm(exited) if attempt.stop_reason is None else None
    if by_person is not None:
        _cancelled_outside(session, run, attempt, by_person, stopped)
        return
    failure = _diagnose(attempt, exited, stopped, code)
    failure = _storage_failure(run, attempt, exited, failure) or failure
    attempt_transition(attempt, AttemptStatus.CRASHED if failure.cause is Cause.VANISHED else AttemptStatus.FAILED)
    attempt.cause = failure.cause.value
    attempt.failed_rank = failure.rank
    attempt.exception = failure.exception
    attempt.log_tail = failure.log_tail[-8000:]
    attempt.reason = failure.summary()
    if RunStatus(run.status) is RunStatus.PAUSING:
        transition(session, run.id, RunStatus.PAUSED, f"paused; the attempt ended {attempt.reason}")
        return
    if RunStatus(run.status) is RunStatus.CANCELLING:
        transition(session, run.id, RunStatus.CANCELLED, f"cancelled; the attempt ended {attempt.reason}")
        return
    _apply_retry_policy(session, run, attempt, failure, now)


# Diagnoses a storage fault at the attempt's end explains better: the ranks' own evidence (their
# logs, their error files) was lost with the writes that failed.
_STORAGE_EXPLAINS = frozenset({Cause.UNKNOWN, Cause.USER_ERROR, Cause.SIGNAL, Cause.VANISHED})


def _storage_failure(run: Run, attempt: Attempt, exited: dict[str, Any] | None, diagnosed: Failure) -> Failure | None:
    """The storage's part in the attempt's end, or None: the run folder deleted under it
    (``RUN_DIR_DELETED``, never retried), or a ``DISK`` failure when the launcher could not write
    its exit file (it says so in the record it wrote late, or there is no record and the attempt's
    folder cannot be written now), naming the path and the errno."""
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
    else:
        return None
    return Failure(Cause.DISK, None, text, diagnosed.log_tail, detail=disk_detail(text, Path(attempt.dir)))


def launch_failed_on_storage(session: Session, run: Run, attempt: Attempt, exc: OSError, now: float) -> bool:
    """A launch that failed because the storage refused a write (a read-only or full run folder)
    is a ``DISK`` failure of the attempt, handed to the retry policy like any other (the retry
    waits until the folder is writable: orchestrator/scheduler/admission.py); a deleted run folder ends the
    run. Returns False when ``exc`` is not a storage fault (the caller fails the launch)."""
    run_dir = Path(run.run_dir)
    fault = storage_fault(exc, attempt.dir)
    if fault is None and not run_dir_deleted(run_dir):
        return False
    _record(session, attempt, None, now)
    if fault is None:
        failure = Failure(Cause.RUN_DIR_DELETED, None, deleted_message(run_dir), "")
    else:
        text = f"launch failed: [Errno {fault.errno}] {fault.strerror}: '{fault.path}'"
        failure = Failure(Cause.DISK, None, text, "", detail=disk_detail(text, Path(attempt.dir)))
    attempt_transition(attempt, AttemptStatus.FAILED)
    attempt.cause, attempt.exception, attempt.reason = failure.cause.value, failure.exception, failure.summary()
    _apply_retry_policy(session, run, attempt, failure, now)
    return True



def _cancelled_outside(session: Session, run: Run, attempt: Attempt, how: str, stopped: dict[str, Any] | None) -> None:
    """A person cancelled the run's Slurm job: the run ends CANCELLED, not resubmitted as a
    preemption would be, and says who and when where Slurm told."""
    attempt_transition(attempt, AttemptStatus.CANCELLED)
    ckpt = (f"last checkpoint at step {attempt.last_checkpoint_step}" if attempt.last_checkpoint_step
            else "no checkpoint")
    saved = " (the ranks saved one at the stop)" if stopped else ""
    attempt.reason = (f"cancelled outside runyard: {how}, at step {attempt.last_step or 0}; {ckpt}{saved}; not "
                      f"resubmitted (a person's scancel is not a preemption): `runyard resume {run.id}` continues")
    # The state machine reaches CANCELLED through CANCELLING; both in this one commit.
    transition(session, run.id, RunStatus.CANCELLING, f"cancelled outside runyard: {how}")
    transition(session, run.id, RunStatus.CANCELLED, attempt.reason)
    _event(session, run, attempt, "warning", attempt.reason)


def finished_ranks(attempt_dir: Path) -> set[int]:
    """Ranks that left the note that their work is done (trainer/process/lifecycle.py's write_finished)."""
    folder = AttemptPaths(attempt_dir).finished
    return {int(p.stem.removeprefix("rank-")) for p in folder.glob("rank-*.json")} if folder.is_dir() else set()


def died_after_finishing(run: Run, attempt: Attempt) -> str | None:
    """When every rank had finished its work (metrics flushed, last checkpoint durable) and the
    only failures are deaths by a signal, the attempt succeeded: a rank that aborts in the
    interpreter's shutdown (C++ destructors of the process group's threads race it now and
    then) has lost nothing, and retrying would redo finished work. Returns the warning to
    record, or None when the attempt really failed."""
    if attempt.stop_reason is not None:
        return None
    attempt_dir = Path(attempt.dir)
    world_size = attempt_config(run, attempt).launch.world_size
    if finished_ranks(attempt_dir) != set(range(world_size)):
        return None
    failures = rank_failures(attempt_dir)
    if not failures or any(f.message or f.exitcode is None or f.exitcode >= 0 for f in failures):
        return None
    deaths = ", ".join(f"rank {f.rank} by {signal_name(f.exitcode)}" for f in failures if f.exitcode is not None)
    return (f"every rank had finished its work, then the processes died in shutdown ({deaths}); "
            "nothing was lost, so the attempt counts as a success")


def _diagnose(attempt: Attempt, exited: dict[str, Any] | None, stopped: dict[str, Any] | None,
              code: int | None) -> Failure:
    if attempt.stop_reason == StopReason.HANG:
        # runyard killed every rank, so the exit codes say nothing about which one hung: the rank
        # is the one the stacks named when the hang was detected (orchestrator/scheduler/watchdog.py).
        base = classify(Path(attempt.dir), code) if exited else None
        return Failure(Cause.HANG, attempt.failed_rank,
                       f"no progress after step {attempt.last_step or 0}; stacks in {Path(attempt.dir) / 'stacks'}",
                       base.log_tail if base else "")
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


def _apply_retry_policy(session: Session, run: Run, attempt: Attempt, failure: Failure, now: float) -> None:
    config = config_from_json(run.config_json)
    earlier = session.execute(
        select(Attempt).where(Attempt.run_id == run.id, Attempt.number < attempt.number,
                              Attempt.cause.is_not(None)).order_by(Attempt.number)
    ).scalars().all()
    script = config.workload.kind == "script"

    def outcome(a: Attempt) -> AttemptOutcome:
        return AttemptOutcome(a.number, Cause(a.cause), a.exception, a.last_step,
                              steps_known=not script or a.first_step_at is not None)

    # A retry that failed loading the script checkpoint it was handed: that version is refused and
    # the next attempt starts from the one before, not the user's repeated error (checkpoint_loads).
    fallback = refuse_unloadable(session, run, attempt, same_exception) if script else None
    if fallback is not None and run.retries_used < config.retry.max_retries:
        delay = backoff_s(run.retries_used, config.retry)
        decision = Decision(True, f"{fallback.words(attempt.number)}: retry {run.retries_used + 1} of "
                                  f"{config.retry.max_retries} in {delay:.0f} s", delay_s=delay)
    else:
        decision = decide(outcome(attempt), [outcome(a) for a in earlier], run.retries_used, config.retry,
                          attempt_config(run, attempt).train.model_dump())
    attempt.retry_counted = decision.counted
    if decision.retry:
        run.retries_used += 1 if decision.counted else 0
        run.retry_at = now + decision.delay_s
        transition(session, run.id, RunStatus.RETRYING, decision.reason)
        _event(session, run, attempt, "warning",
               f"attempt {attempt.number} failed: {failure.summary()}; {decision.reason}")
    else:
        transition(session, run.id, RunStatus.FAILED, decision.reason)
        _event(session, run, attempt, "error",
               f"attempt {attempt.number} failed: {failure.summary()}; {decision.reason}")
