"""What an ended attempt means for its run: success, a stop runyard asked for (cancel, pause),
or a failure that is classified and handed to the retry policy.

The decision is a table (:data:`ENDINGS`): what is known once the processes are gone, in plain
values (:class:`Ended`), gives one :class:`Ending`, the first whose rule holds; each ending is
applied by one small function (:data:`APPLIERS`). Every attempt keeps its evidence for the
timeline: cause, first failing rank, exception line, log tail, steps lost since the last
checkpoint, and when it failed and was detected (orchestrator/scheduler/diagnosis.py reads it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.models import Attempt, Checkpoint, Event, Run
from db.states import STOPPING, AttemptStatus, RunStatus, SignalSent, StopReason, attempt_transition, transition
from db.sweeps.requests import prune_words
from db.vocabulary.causes import Cause
from db.vocabulary.config import RunConfig, config_from_json, deep_merge
from db.vocabulary.config.workload import STORED
from orchestrator.executors.slurm.executor import cancelled_in_slurm
from orchestrator.scheduler.diagnosis import (
    diagnose,
    died_after_finishing,
    first_failure_at,
    read_stopped,
    storage_failure,
)
from orchestrator.scheduler.failures import Failure
from orchestrator.scheduler.repeats import log_after_commit
from orchestrator.scheduler.retry import AttemptOutcome, Decision, decide, halved_micro_batch, same_exception
from orchestrator.scheduler.storage import StorageFault
from orchestrator.scripts.checkpoint_loads import refuse_unloadable

logger = logging.getLogger(__name__)


def attempt_config(run: Run, attempt: Attempt) -> RunConfig:
    """The config an attempt ran with: the run's, plus the attempt's overrides."""
    return with_overrides(config_from_json(run.config_json), json.loads(attempt.overrides_json or "{}"))


def with_overrides(config: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """``config`` (a stored run's) with an attempt's ``overrides``, validated as the stored config
    it is (the ``STORED`` context): a run stored before a rule was tightened (its tags) is still
    retried with half its micro-batch."""
    if not overrides:
        return config
    return RunConfig.model_validate(deep_merge(config.as_dict(), overrides), context={STORED: True})


def next_overrides(config: RunConfig, previous: Attempt | None) -> dict[str, Any]:
    """Overrides for the next attempt of a run stored with ``config``: the previous attempt's,
    after a CUDA OOM with half its micro-batch and twice its accumulation."""
    if previous is None:
        return {}
    overrides: dict[str, Any] = json.loads(previous.overrides_json or "{}")
    if previous.cause == Cause.CUDA_OOM.value:
        train = {**config.train.model_dump(), **overrides.get("train", {})}  # the previous attempt's
        overrides = deep_merge(overrides, halved_micro_batch(int(train["batch_size"]), int(train["grad_accum"])))
    return overrides


# -- the decision ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ended:
    """What is known once an attempt's processes are gone, in plain values."""

    run_status: RunStatus
    stop_reason: StopReason | None  # why runyard stopped it (None: it was not stopped)
    stop_mode: StopReason  # how a stop ends the run (:func:`stop_mode`)
    exit_code: int | None
    exited: bool  # the launcher left its exit record
    stopped: bool  # the ranks checkpointed and stopped at a signal (stopped.json)
    trained_every_step: bool  # the run has a step budget and the attempt reached it
    shutdown_crash: str | None = None  # every rank finished, then died in shutdown (diagnosis.py)
    cancelled_by: str | None = None  # a person cancelled its Slurm job, in words

    @property
    def asked_to_stop(self) -> bool:
        return self.stop_reason in (StopReason.CANCEL, StopReason.PAUSE, StopReason.PRUNE)

    @property
    def stopping(self) -> bool:
        """Ended by a stop: one runyard asked for, or a run being stopped whose launcher left no record."""
        return self.asked_to_stop or (self.run_status in STOPPING and not self.exited)


class Ending(Enum):
    """How an ended attempt ends its run; the value is the rule in a sentence."""

    FINISHED_BEFORE_STOP = "every step was trained before the cancel or pause took effect: the run succeeded"
    PAUSED = "stopped by a pause: the run is paused, to be resumed from its last checkpoint"
    PRUNED = "stopped early by its sweep: the trial is pruned, to be promoted from its last checkpoint"
    CANCELLED = "stopped by a cancel: the run is cancelled"
    SUCCEEDED = "every rank exited 0, or died in its shutdown after finishing its work: the run succeeded"
    CANCELLED_OUTSIDE = "a person cancelled its Slurm job: the run is cancelled, not resubmitted"
    FAILED_WHILE_PAUSING = ("it failed while a pause (or a prune) was carried out: the failure is recorded, the run "
                            "paused (pruned)")
    FAILED_WHILE_CANCELLING = "it failed while a cancel was carried out: the failure is recorded, the run cancelled"
    FAILED = "it failed: the failure is recorded and handed to the retry policy"


# One row a rule: the first whose test holds is the ending. Before the failure's causes, a person's
# scancel: the ranks' checkpoint at its SIGTERM must not read as a preemption.
ENDINGS: tuple[tuple[Ending, Callable[[Ended], bool]], ...] = (
    (Ending.FINISHED_BEFORE_STOP,
     lambda e: e.asked_to_stop and e.exit_code == 0 and not e.stopped and e.trained_every_step),
    (Ending.PAUSED, lambda e: e.stopping and e.stop_mode is StopReason.PAUSE),
    (Ending.PRUNED, lambda e: e.stopping and e.stop_mode is StopReason.PRUNE),
    (Ending.CANCELLED, lambda e: e.stopping),
    (Ending.SUCCEEDED, lambda e: (e.exit_code == 0 or e.shutdown_crash is not None) and not e.stopped),
    (Ending.CANCELLED_OUTSIDE, lambda e: e.cancelled_by is not None),
    (Ending.FAILED_WHILE_PAUSING, lambda e: e.run_status is RunStatus.PAUSING),
    (Ending.FAILED_WHILE_CANCELLING, lambda e: e.run_status is RunStatus.CANCELLING),
    (Ending.FAILED, lambda e: True),
)


def ending(ended: Ended) -> Ending:
    """The first rule of :data:`ENDINGS` that holds for ``ended``."""
    return next(found for found, holds in ENDINGS if holds(ended))


def stop_mode(run: Run, attempt: Attempt) -> StopReason:
    """How a stopped attempt's run ends: PAUSING pauses (or prunes, as ``runs.stop_mode`` says);
    CANCELLING ends as its request says (a cancel asked for while pausing turns ``runs.stop_mode``
    into a cancel after the attempt's SIGTERM was sent as a pause); otherwise the reason the
    attempt was stopped for."""
    status = RunStatus(run.status)
    if status is RunStatus.PAUSING:
        return StopReason.PRUNE if run.stop_mode == StopReason.PRUNE else StopReason.PAUSE
    if status is RunStatus.CANCELLING and run.stop_mode:
        return StopReason(run.stop_mode)
    return StopReason(attempt.stop_reason or StopReason.CANCEL)


def ended_of(run: Run, attempt: Attempt, exited: dict[str, Any] | None, stopped: dict[str, Any] | None,
             config: RunConfig) -> Ended:
    """What :func:`ending` judges, read from the rows (``attempt`` already recorded), the records
    and the attempt's ``config``."""
    code = attempt.exit_code
    return Ended(
        run_status=RunStatus(run.status),
        stop_reason=StopReason(attempt.stop_reason) if attempt.stop_reason else None,
        stop_mode=stop_mode(run, attempt), exit_code=code, exited=exited is not None, stopped=stopped is not None,
        trained_every_step=bool(run.max_steps) and (attempt.last_step or 0) >= run.max_steps,
        shutdown_crash=died_after_finishing(attempt, config) if code and stopped is None and exited else None,
        cancelled_by=cancelled_in_slurm(exited) if attempt.stop_reason is None else None,
    )


# -- settling: the decision applied ------------------------------------------------------------


@dataclass(frozen=True)
class Settling:
    """One attempt being settled: the rows, what the decision read, and when."""

    session: Session
    run: Run
    attempt: Attempt
    config: RunConfig  # the attempt's
    exited: dict[str, Any] | None
    stopped: dict[str, Any] | None
    ended: Ended
    storage: StorageFault | None
    now: float


def settle(session: Session, run: Run, attempt: Attempt, exited: dict[str, Any] | None,
           now: float | None = None, storage: StorageFault | None = None, config: RunConfig | None = None) -> None:
    """The attempt's processes are gone: record how it ended and move the run on, as
    :func:`ending` decides.

    ``storage``: a storage fault the scheduler saw while the attempt ran (orchestrator/scheduler/storage.py's
    ``StorageFaults.seen_since``): an exit code with no evidence is then a ``DISK`` failure.
    ``config``: the attempt's (:func:`attempt_config`, which the scheduler derives once for the
    settling; derived here when not given).
    """
    now = time.time() if now is None else now
    config = attempt_config(run, attempt) if config is None else config
    stopped = read_stopped(Path(attempt.dir))
    record_end(session, attempt, exited, now)
    ended = ended_of(run, attempt, exited, stopped, config)
    APPLIERS[ending(ended)](Settling(session, run, attempt, config, exited, stopped, ended, storage, now))


def record_end(session: Session, attempt: Attempt, exited: dict[str, Any] | None, now: float) -> None:
    """The attempt's end for its timeline: exit code, when it failed and was detected, its last
    checkpoint and the steps lost since."""
    attempt.exit_code = int(exited["exit_code"]) if exited else None
    attempt.ended_at = float(exited["ended_at"]) if exited else now
    # The rank's failure, as the agent saw it, before it stopped the other ranks; else the exit.
    seen = first_failure_at(Path(attempt.dir)) if attempt.exit_code else None
    attempt.failed_at = min(seen, attempt.ended_at) if seen is not None else attempt.ended_at
    attempt.detected_at = now
    attempt.last_checkpoint_step = _last_checkpoint(session, attempt)
    reached = attempt.last_step if attempt.last_step is not None else (attempt.resume_step or 0)
    attempt.steps_lost = max(0, reached - (attempt.last_checkpoint_step or 0))


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


def _finished_before_stop(s: Settling) -> None:
    """The ranks had trained every step and were finishing (the final save, the teardown) when the
    cancel or pause arrived: they ended on their own, and the run is done."""
    attempt = s.attempt
    asked = "pause" if s.ended.stop_reason is StopReason.PAUSE else "cancel"
    finished = f"all ranks finished (step {attempt.last_step}/{s.run.max_steps}) before the {asked} took effect"
    attempt_transition(attempt, AttemptStatus.SUCCEEDED, finished)
    transition(s.session, s.run.id, RunStatus.SUCCEEDED, finished)
    _event(s, "info", finished)


def _stopped(s: Settling) -> None:
    """Paused, pruned or cancelled as asked, with a checkpoint or killed (a pruned trial's attempt
    ends PAUSED: stopped like a pause, with its checkpoint)."""
    attempt, code, mode = s.attempt, s.attempt.exit_code, s.ended.stop_mode
    paused = mode in (StopReason.PAUSE, StopReason.PRUNE)
    attempt_transition(attempt, AttemptStatus.PAUSED if paused else AttemptStatus.CANCELLED)
    ckpt = (f"last checkpoint at step {attempt.last_checkpoint_step}" if attempt.last_checkpoint_step
            else "no checkpoint")
    how = "with a checkpoint" if s.stopped else f"killed with {attempt.signal_sent or 'a signal'}"
    if s.stopped and code and attempt.signal_sent not in (None, SignalSent.SIGKILL):
        # The ranks checkpointed and stopped as asked; torchrun's agent, which got the same
        # signal, answers it with a non-zero exit of its own: not the ranks' failure.
        how += (f"; the ranks stopped cleanly; the launcher's own exit code {code} is how torchrun "
                f"ends when it is sent {attempt.signal_sent}, not a failure")
        attempt.exit_code = 0
    if mode is StopReason.PRUNE:
        attempt.reason = (f"stopped early by {prune_words(s.session, s.run.id)} at step {attempt.last_step or 0} "
                          f"({how}); {ckpt}; a promotion continues from it")
    elif paused:
        attempt.reason = f"paused at step {attempt.last_step or 0} ({how}); {ckpt}; Resume continues from it"
    else:
        attempt.reason = f"cancelled at step {attempt.last_step or 0} ({how}); {ckpt}"
    ended = RunStatus.PRUNED if mode is StopReason.PRUNE else RunStatus.PAUSED if paused else RunStatus.CANCELLED
    transition(s.session, s.run.id, ended, attempt.reason)
    _event(s, "info", attempt.reason)


def _succeeded(s: Settling) -> None:
    attempt = s.attempt
    finished = "all ranks finished"
    if attempt.last_step is None and s.config.workload.kind == "script":
        finished = ("all ranks exited 0, but the script reported no step: runyard cannot tell that it trained "
                    "(no SDK step, RUNYARD line, workload.stdout_metrics match or TensorBoard scalar); check "
                    "its logs")
        _event(s, "warning", finished)
    attempt_transition(attempt, AttemptStatus.SUCCEEDED, finished)
    transition(s.session, s.run.id, RunStatus.SUCCEEDED, finished)
    if s.ended.shutdown_crash:
        _event(s, "warning", s.ended.shutdown_crash)
    _event(s, "info", f"attempt {attempt.number} succeeded")


def _cancelled_outside(s: Settling) -> None:
    """A person cancelled the run's Slurm job: the run ends CANCELLED, not resubmitted as a
    preemption would be, and says who and when where Slurm told."""
    attempt, how = s.attempt, s.ended.cancelled_by
    attempt_transition(attempt, AttemptStatus.CANCELLED)
    ckpt = (f"last checkpoint at step {attempt.last_checkpoint_step}" if attempt.last_checkpoint_step
            else "no checkpoint")
    saved = " (the ranks saved one at the stop)" if s.stopped else ""
    attempt.reason = (f"cancelled outside runyard: {how}, at step {attempt.last_step or 0}; {ckpt}{saved}; not "
                      f"resubmitted (a person's scancel is not a preemption): `runyard resume {s.run.id}` continues")
    # The state machine reaches CANCELLED through CANCELLING; both in this one commit.
    transition(s.session, s.run.id, RunStatus.CANCELLING, f"cancelled outside runyard: {how}")
    transition(s.session, s.run.id, RunStatus.CANCELLED, attempt.reason)
    _event(s, "warning", attempt.reason)


def _failure(s: Settling) -> Failure:
    """Diagnose the failure (the storage's part first) and record it on the attempt."""
    attempt = s.attempt
    diagnosed = diagnose(attempt, s.exited, s.stopped)
    failure = storage_failure(s.run, attempt, s.exited, diagnosed, s.storage) or diagnosed
    attempt_transition(attempt, AttemptStatus.CRASHED if failure.cause is Cause.VANISHED else AttemptStatus.FAILED)
    attempt.cause = failure.cause.value
    attempt.failed_rank = failure.rank
    attempt.exception = failure.exception
    attempt.log_tail = failure.log_tail[-8000:]
    attempt.reason = failure.summary()
    return failure


def _failed_while_pausing(s: Settling) -> None:
    _failure(s)
    pruned = s.ended.stop_mode is StopReason.PRUNE
    transition(s.session, s.run.id, RunStatus.PRUNED if pruned else RunStatus.PAUSED,
               f"{'pruned' if pruned else 'paused'}; the attempt ended {s.attempt.reason}")


def _failed_while_cancelling(s: Settling) -> None:
    _failure(s)
    transition(s.session, s.run.id, RunStatus.CANCELLED, f"cancelled; the attempt ended {s.attempt.reason}")


def _failed(s: Settling) -> None:
    retry_or_fail(s.session, s.run, s.attempt, _failure(s), s.now, s.config)


APPLIERS: dict[Ending, Callable[[Settling], None]] = {
    Ending.FINISHED_BEFORE_STOP: _finished_before_stop,
    Ending.PAUSED: _stopped,
    Ending.PRUNED: _stopped,
    Ending.CANCELLED: _stopped,
    Ending.SUCCEEDED: _succeeded,
    Ending.CANCELLED_OUTSIDE: _cancelled_outside,
    Ending.FAILED_WHILE_PAUSING: _failed_while_pausing,
    Ending.FAILED_WHILE_CANCELLING: _failed_while_cancelling,
    Ending.FAILED: _failed,
}


def retry_or_fail(session: Session, run: Run, attempt: Attempt, failure: Failure, now: float,
                  config: RunConfig) -> None:
    """Ask the retry policy (orchestrator/scheduler/retry.py) about the failed ``attempt`` (run
    with ``config``) and move the run as it decides: RETRYING after its backoff, or FAILED."""
    script = config.workload.kind == "script"
    earlier = session.execute(
        select(Attempt).where(Attempt.run_id == run.id, Attempt.number < attempt.number,
                              Attempt.cause.is_not(None)).order_by(Attempt.number)
    ).scalars().all()
    outcome = _outcomes(session, run, script)  # read before a refusal below
    # A retry that failed loading the script checkpoint it was handed: that version is refused and
    # the next attempt starts from the one before, not the user's repeated error (checkpoint_loads).
    fallback = refuse_unloadable(session, run, attempt, same_exception) if script else None
    decision = decide(outcome(attempt), [outcome(a) for a in earlier], run.retries_used, config.retry,
                      config.train.model_dump(), fallback=fallback.words(attempt.number) if fallback else None)
    _move_run(session, run, attempt, failure, decision, now)


def _outcomes(session: Session, run: Run, script: bool) -> Callable[[Attempt], AttemptOutcome]:
    """What the retry policy reads of each failed attempt of ``run``."""
    # The newest step each attempt saved a checkpoint of its own at (a refused one does not count:
    # no attempt can start from it), for the retry policy's "no progress past its start".
    saved: dict[int, int] = {number: step for number, step in session.execute(
        select(Checkpoint.attempt, func.max(Checkpoint.step))
        .where(Checkpoint.run_id == run.id, Checkpoint.refused_reason.is_(None))
        .group_by(Checkpoint.attempt))}

    def outcome(a: Attempt) -> AttemptOutcome:
        return AttemptOutcome(a.number, Cause(a.cause), a.exception, a.last_step,
                              steps_known=not script or a.first_step_at is not None,
                              resumed_from=a.resume_step, saved_at=saved.get(a.number))

    return outcome


def _move_run(session: Session, run: Run, attempt: Attempt, failure: Failure, decision: Decision,
              now: float) -> None:
    attempt.retry_counted = decision.counted
    if decision.retry:
        run.retries_used += 1 if decision.counted else 0
        run.retry_at = now + decision.delay_s
        transition(session, run.id, RunStatus.RETRYING, decision.reason)
        _log_event(session, run, attempt, "warning",
                   f"attempt {attempt.number} failed: {failure.summary()}; {decision.reason}")
    else:
        transition(session, run.id, RunStatus.FAILED, decision.reason)
        _log_event(session, run, attempt, "error",
                   f"attempt {attempt.number} failed: {failure.summary()}; {decision.reason}")


def _event(s: Settling, level: str, message: str) -> None:
    _log_event(s.session, s.run, s.attempt, level, message)


def _log_event(session: Session, run: Run, attempt: Attempt, level: str, message: str) -> None:
    session.add(Event(run_id=run.id, attempt=attempt.number, at=time.time(), level=level, kind="exit", message=message))
    log_after_commit(session, logger, f"run {run.id} attempt {attempt.number}: {message}")
