"""The sweep state machine: one enum, one table of allowed transitions, one ``transition()``, in
the style of the run's (db/states.py).

A sweep is RUNNING from its start: the scheduler's ``sweeps`` job starts trials, stops the ones
that fall behind and promotes the ones that catch up. PAUSED starts and promotes nothing (the
trials already training go on, and are still stopped early at their rungs). It ends FINISHED
(nothing left to start and no trial training), STOPPED (its budget reached or its breaker tripped:
the sentence says which) or CANCELLED (a person's word: its trials are cancelled with it).
Nothing else assigns a sweep's status.
"""

from __future__ import annotations

import enum
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from db import DatabaseError
from db.models import Sweep, SweepStatusHistory
from db.states import moved


class SweepStatus(str, enum.Enum):
    RUNNING = "RUNNING"  # trials are started, stopped early and promoted
    PAUSED = "PAUSED"  # nothing new starts and nothing is promoted; trials training go on
    FINISHED = "FINISHED"  # nothing left to start and no trial training
    STOPPED = "STOPPED"  # its budget was reached or its breaker tripped (status_reason says which)
    CANCELLED = "CANCELLED"  # a person cancelled it, and its trials

    def __str__(self) -> str:
        return self.value


SWEEP_TERMINAL: frozenset[SweepStatus] = frozenset({SweepStatus.FINISHED, SweepStatus.STOPPED,
                                                    SweepStatus.CANCELLED})

SWEEP_ALLOWED: dict[SweepStatus, frozenset[SweepStatus]] = {
    SweepStatus.RUNNING: frozenset({SweepStatus.PAUSED, SweepStatus.FINISHED, SweepStatus.STOPPED,
                                    SweepStatus.CANCELLED}),
    # A paused sweep resumes, or is cancelled; its budget and its breaker are judged once it runs.
    SweepStatus.PAUSED: frozenset({SweepStatus.RUNNING, SweepStatus.CANCELLED}),
    # An ended sweep stays ended: its trials are runs, which can still be resumed or forked one by
    # one (or promoted: `runyard sweep promote`), and a new sweep starts from the same file.
    SweepStatus.FINISHED: frozenset(),
    SweepStatus.STOPPED: frozenset(),
    SweepStatus.CANCELLED: frozenset(),
}


# What stopped a sweep, as its reason says it (orchestrator/sweeps/budget.py writes the sentences
# with these words; the alerts tell the two apart by them: orchestrator/alerts/sweep_triggers.py).
BREAKER_WORDS = "the breaker stops the sweep"
BUDGET_WORDS = "its budget is reached"


def stopped_by(reason: str | None) -> str | None:
    """``"breaker"`` or ``"budget"``: what a STOPPED sweep's ``reason`` says stopped it; None when
    it names neither."""
    text = reason or ""
    if BREAKER_WORDS in text:
        return "breaker"
    if BUDGET_WORDS in text:
        return "budget"
    return None


class SweepTransitionError(DatabaseError):
    """A transition that the sweep state machine does not allow, or a sweep that does not exist."""


def sweep_transition(session: Session, sweep_id: int, to: SweepStatus, reason: str, *,
                     expect: SweepStatus | None = None, now: float | None = None) -> bool:
    """Move a sweep to ``to`` if the machine allows it from its current status: a conditional
    UPDATE (two processes racing cannot both win) and a history row with ``reason``. The caller
    commits.

    Returns:
        True when the sweep moved; False when its status did not allow it (someone moved it first).

    Raises:
        SweepTransitionError: the sweep does not exist, or ``expect`` cannot reach ``to``.
    """
    if expect is not None and to not in SWEEP_ALLOWED[expect]:
        raise SweepTransitionError(f"{expect} -> {to} is not an allowed sweep transition")
    found = session.scalar(select(Sweep.status).where(Sweep.id == sweep_id))
    if found is None:
        raise SweepTransitionError(f"sweep {sweep_id} does not exist")
    if to not in SWEEP_ALLOWED[SweepStatus(found)] or expect not in (None, SweepStatus(found)):
        return False
    at = time.time() if now is None else now
    change: dict[str, object] = {"status": to.value, "status_reason": reason, "updated_at": at,
                                 **({"ended_at": at} if to in SWEEP_TERMINAL else {})}
    if not moved(session, Sweep, sweep_id, found, change):
        return False
    session.add(SweepStatusHistory(sweep_id=sweep_id, from_status=found, to_status=to.value, reason=reason, at=at))
    return True
