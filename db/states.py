"""The run state machine: one enum, one table of allowed transitions, one ``transition()``.

Nothing else assigns a run's status. ``transition`` is a conditional UPDATE (``WHERE status IN
allowed-from``), so two processes racing to move the same run cannot both win, and every change
appends a history row with its reason.
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Any, cast

from db import DatabaseError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from db.models import Attempt, Stateful

# SQLAlchemy and the models are imported by the functions that write: the ranks read this
# module's vocabulary (the phases) and must not pay for SQLAlchemy at start-up (issue 32).


class RunStatus(str, enum.Enum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"  # torchrun launched, no step completed yet
    RUNNING = "RUNNING"  # at least one step completed in the current attempt
    RETRYING = "RETRYING"  # waiting out a backoff before the next attempt
    CANCELLING = "CANCELLING"  # cancel requested; processes being stopped
    PAUSING = "PAUSING"  # pause requested; the ranks checkpoint and stop, then it is PAUSED
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PAUSED = "PAUSED"  # stopped with a last checkpoint, to be resumed: Resume continues from it
    # A sweep's trial stopped early (below its rung's cut, or its sweep's budget reached): stopped
    # like a pause (PAUSING, the ranks checkpoint), and continued from that checkpoint if promoted.
    PRUNED = "PRUNED"

    def __str__(self) -> str:
        return self.value


class StopReason(str, enum.Enum):
    """Why runyard itself stopped an attempt (``attempts.stop_reason``; ``runs.stop_mode`` holds
    cancel or pause while a run is CANCELLING, pause or prune while it is PAUSING)."""

    CANCEL = "cancel"
    PAUSE = "pause"  # stop with the intent to resume: the run is PAUSED, its Resume continues
    HANG = "hang"  # no progress: stacks saved, then killed
    PRUNE = "prune"  # a sweep stops its trial early: a pause that ends PRUNED (runs.stop_mode while PAUSING)

    def __str__(self) -> str:
        return self.value


class SignalSent(str, enum.Enum):
    """The strongest signal runyard has sent an attempt's processes (``attempts.signal_sent``)."""

    SIGTERM = "SIGTERM"  # the ranks finish the step, checkpoint and exit
    SIGKILL = "SIGKILL"  # after the grace period, or for a hang
    # A script's own stop signal instead of SIGTERM (workload.stop_signal): the graceful stop too.
    SIGINT = "SIGINT"
    SIGHUP = "SIGHUP"
    SIGUSR1 = "SIGUSR1"
    SIGUSR2 = "SIGUSR2"

    def __str__(self) -> str:
        return self.value


class AttemptPhase(str, enum.Enum):
    """What rank 0 says the attempt is doing (``attempts.phase``; NULL while it trains).

    Before the first step: NULL while torchrun starts the ranks and they join (rendezvous),
    then SETUP, then FIRST_STEP; the first completed step clears it."""

    SETUP = "setup"  # the ranks joined: loading the data, building the model, restoring a checkpoint
    FIRST_STEP = "first_step"  # the loop began: the first step (with torch.compile: compiling)
    FINISHING = "finishing"  # after the last step: the final save and the teardown

    def __str__(self) -> str:
        return self.value


STARTUP_PHASES = frozenset({AttemptPhase.SETUP.value, AttemptPhase.FIRST_STEP.value})


class AttemptStatus(str, enum.Enum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # the launcher exited non-zero
    CRASHED = "CRASHED"  # the processes vanished without an exit code (killed, host reboot)
    CANCELLED = "CANCELLED"
    PAUSED = "PAUSED"  # stopped by a pause, with its checkpoint

    def __str__(self) -> str:
        return self.value


TERMINAL: frozenset[RunStatus] = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.PAUSED, RunStatus.PRUNED}
)
TERMINAL_VALUES: frozenset[str] = frozenset(s.value for s in TERMINAL)  # as a run dict's "status" holds them
# Ended with a last checkpoint, to be continued: Resume (a PRUNED trial's promotion) or a cancel for good.
RESUMABLE: frozenset[RunStatus] = frozenset({RunStatus.PAUSED, RunStatus.PRUNED})
ACTIVE: frozenset[RunStatus] = frozenset(
    {RunStatus.STARTING, RunStatus.RUNNING, RunStatus.CANCELLING, RunStatus.PAUSING}
)
# Being stopped by a person: the scheduler sends SIGTERM, then SIGKILL after the grace period.
STOPPING: frozenset[RunStatus] = frozenset({RunStatus.CANCELLING, RunStatus.PAUSING})

ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.STARTING, RunStatus.CANCELLED, RunStatus.PAUSED, RunStatus.PRUNED}),
    RunStatus.STARTING: frozenset(
        {RunStatus.RUNNING, RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.RETRYING,
         RunStatus.CANCELLING, RunStatus.PAUSING}
    ),
    RunStatus.RUNNING: frozenset(
        {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.RETRYING, RunStatus.CANCELLING, RunStatus.PAUSING}
    ),
    RunStatus.RETRYING: frozenset({RunStatus.STARTING, RunStatus.CANCELLED, RunStatus.PAUSED, RunStatus.PRUNED}),
    RunStatus.CANCELLING: frozenset(
        {RunStatus.CANCELLED, RunStatus.PAUSED, RunStatus.SUCCEEDED, RunStatus.FAILED}
    ),
    # A pause being carried out ends PAUSED (a sweep's prune: PRUNED; SUCCEEDED when the ranks had
    # finished every step); a cancel asked for meanwhile turns it into a cancel.
    RunStatus.PAUSING: frozenset(
        {RunStatus.PAUSED, RunStatus.PRUNED, RunStatus.CANCELLING, RunStatus.CANCELLED, RunStatus.SUCCEEDED,
         RunStatus.FAILED}
    ),
    # A finished run can be resumed from one of its checkpoints: it is queued again and its
    # next attempt starts from that checkpoint.
    RunStatus.SUCCEEDED: frozenset({RunStatus.QUEUED}),
    RunStatus.FAILED: frozenset({RunStatus.QUEUED}),
    RunStatus.CANCELLED: frozenset({RunStatus.QUEUED}),
    # A paused run waits to be resumed, or is cancelled for good; a pruned trial likewise (its
    # promotion is a resume).
    RunStatus.PAUSED: frozenset({RunStatus.QUEUED, RunStatus.CANCELLED}),
    RunStatus.PRUNED: frozenset({RunStatus.QUEUED, RunStatus.CANCELLED}),
}


# An attempt is RUNNING from its launch until its processes are gone; then it ends once.
ATTEMPT_ALLOWED: dict[AttemptStatus, frozenset[AttemptStatus]] = {
    AttemptStatus.RUNNING: frozenset(
        {AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.CRASHED, AttemptStatus.CANCELLED,
         AttemptStatus.PAUSED}
    ),
    AttemptStatus.SUCCEEDED: frozenset(),
    AttemptStatus.FAILED: frozenset(),
    AttemptStatus.CRASHED: frozenset(),
    AttemptStatus.CANCELLED: frozenset(),
    AttemptStatus.PAUSED: frozenset(),
}


class TransitionError(DatabaseError):
    """A transition that the state machine does not allow from the run's current status."""


def attempt_transition(attempt: Attempt, to: AttemptStatus, reason: str | None = None, *,
                       now: float | None = None) -> None:
    """End ``attempt`` as ``to`` (the only place an attempt's status is assigned after its launch).

    Only the scheduler, which owns the attempt row, calls it, inside the transaction that also
    moves the run. ``ended_at`` is set when not set yet; ``reason`` replaces the attempt's.

    Raises:
        TransitionError: ``to`` is not reachable from the attempt's status (it ended already).
    """
    current = AttemptStatus(attempt.status)
    if to not in ATTEMPT_ALLOWED[current]:
        raise TransitionError(f"attempt {attempt.number} of run {attempt.run_id}: {current} -> {to} is not allowed")
    attempt.status = to.value
    if reason is not None:
        attempt.reason = reason
    if attempt.ended_at is None:
        attempt.ended_at = time.time() if now is None else now


def allowed_from(target: RunStatus) -> frozenset[RunStatus]:
    """The statuses from which ``target`` may be entered."""
    return frozenset(s for s, targets in ALLOWED.items() if target in targets)


def hold(session: Session, run_id: int, expect: RunStatus) -> bool:
    """Lock a run's row for the rest of the transaction, if it is still in ``expect``.

    The scheduler holds a queued run this way while it sweeps the run's leftover processes
    before launching it: a second scheduler racing for the same run either sees it gone from
    ``expect`` already, or waits here (PostgreSQL: the row lock; SQLite: the write lock) until the
    first one's sweep is committed, so that no sweep ever runs after the winner's launch. The
    UPDATE changes nothing (it rewrites ``status`` with itself); the caller commits to release.

    Returns:
        True when the run is in ``expect`` and now held; False when another process moved it.
    """
    from sqlalchemy import CursorResult, update  # noqa: PLC0415 - only to write: the ranks import the enums alone

    from db.models import Run  # noqa: PLC0415 - only to write: the ranks import the enums alone

    result = cast(CursorResult[Any], session.execute(
        update(Run).where(Run.id == run_id, Run.status == expect.value).values(status=Run.status)
        .execution_options(synchronize_session=False)
    ))
    return result.rowcount == 1


def transition(
    session: Session,
    run_id: int,
    to: RunStatus,
    reason: str,
    *,
    expect: RunStatus | None = None,
    now: float | None = None,
) -> bool:
    """Move a run to ``to`` if the machine allows it from its current status.

    Args:
        session: an open session; the caller commits.
        run_id: the run.
        to: the target status.
        reason: why, recorded in the history and on the run.
        expect: only move when the run is currently in this status.
        now: the time to record (defaults to the wall clock).

    Returns:
        True when the run moved; False when its status did not allow it (someone else moved
        it first, or the run is already terminal).
    """
    from sqlalchemy import func, select  # noqa: PLC0415 - only to write: the ranks import the enums alone

    from db.models import Run, RunStatusHistory  # noqa: PLC0415 - only to write: the ranks import the enums alone

    now = time.time() if now is None else now
    sources = allowed_from(to)
    if expect is not None:
        if expect not in sources:
            raise TransitionError(f"{expect} -> {to} is not an allowed transition")
        sources = frozenset({expect})
    current = session.scalar(select(Run.status).where(Run.id == run_id))
    if current is None:
        raise TransitionError(f"run {run_id} does not exist")
    if RunStatus(current) not in sources:
        return False
    values: dict[str, object] = {"status": to.value, "status_reason": reason, "updated_at": now}
    if to is RunStatus.STARTING:
        values["started_at"] = func.coalesce(Run.started_at, now)
    if to in TERMINAL:
        values["ended_at"] = now
    elif to is RunStatus.QUEUED:
        values["ended_at"] = None
    if not moved(session, Run, run_id, current, values):
        return False
    session.add(
        RunStatusHistory(run_id=run_id, from_status=current, to_status=to.value, reason=reason, at=now)
    )
    return True


def moved(session: Session, model: type[Stateful], row_id: int, current: str, values: dict[str, object]) -> bool:
    """Write ``values`` on ``model``'s row ``row_id`` (a run, a sweep) only while its status is still
    ``current``, the one just read: if another process moved it in between, nothing is written.

    Returns:
        Whether the row was written.
    """
    from sqlalchemy import CursorResult, update  # noqa: PLC0415 - only to write: the ranks import the enums alone

    # Session.execute is typed to return a Result; for an UPDATE it is a CursorResult (rowcount).
    result = cast(CursorResult[Any], session.execute(
        update(model).where(model.id == row_id, model.status == current).values(**values)))
    return result.rowcount == 1
