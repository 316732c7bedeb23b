"""Scheduler leases: which scheduler owns which attempts when several share one database.

Each scheduler process has a row in ``scheduler_heartbeat`` (its host, pid, data folder and
``beat_at``, rewritten every couple of seconds); that row is its *lease*. Every attempt records
the scheduler that launched it (``attempts.scheduler_id``), and only that scheduler supervises,
signals and settles it. Another scheduler takes an attempt over only when its owner is presumed
dead, and then handles it as a restarted scheduler handles its own: re-adopted when its
processes are alive on this host, recorded as crashed when they are gone. The owner is presumed
dead when:

- its lease has not been renewed for :data:`LEASE_S` seconds (or its row was deleted), or
- it ran on this host with this data folder: the scheduler lock of that folder is held by the
  scheduler asking, so the owner has exited (a restart takes over at once, as before leases).

The take-over is a conditional UPDATE (``WHERE scheduler_id = <the old owner>``): when two
schedulers try at once, one wins. Launching needs no lease: the QUEUED -> STARTING transition is
itself a conditional UPDATE that one scheduler wins (db/states.py), and only the winner launches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, and_, func, or_, select, update
from sqlalchemy.orm import Session

from db.models import Attempt, Run, SchedulerHeartbeat
from db.states import ACTIVE

# A scheduler whose lease is older than this is presumed dead and its attempts are taken over.
# Far above the 2-s renewal, so that a busy host or a slow database does not hand live runs over.
LEASE_S = 30.0


@dataclass(frozen=True)
class Identity:
    """Who a scheduler is: its lease row, and where it runs."""

    id: int
    host: str
    home: str


@dataclass(frozen=True)
class Owned:
    """An active run as seen by one scheduler."""

    run_id: int
    attempt_id: int | None  # its newest attempt
    owner: int | None  # that attempt's scheduler


def presumed_dead(me: Identity, owner: SchedulerHeartbeat | None, now: float) -> bool:
    """Whether the scheduler ``owner`` (None: its row is gone) is presumed dead (module docstring)."""
    if owner is None:
        return True
    if owner.id == me.id:
        return False
    if owner.host == me.host and owner.home == me.home:
        return True  # this data folder's scheduler lock is ours: that process has exited
    return now - owner.beat_at > LEASE_S


def active_runs(session: Session) -> list[Owned]:
    """The active runs (STARTING, RUNNING, CANCELLING) with their newest attempt and its owner."""
    newest = (select(Attempt.run_id, func.max(Attempt.number).label("number"))
              .group_by(Attempt.run_id).subquery())
    rows = session.execute(
        select(Run.id, Attempt.id, Attempt.scheduler_id)
        .outerjoin(newest, newest.c.run_id == Run.id)
        .outerjoin(Attempt, and_(Attempt.run_id == Run.id, Attempt.number == newest.c.number))
        .where(Run.status.in_([s.value for s in ACTIVE]))
        .order_by(Run.id)
    ).all()
    return [Owned(run_id, attempt_id, owner) for run_id, attempt_id, owner in rows]


def take_over(session: Session, attempt_id: int, old_owner: int | None, me: Identity) -> bool:
    """Make ``me`` the owner of an attempt, if it is still ``old_owner``'s (the caller commits).

    Returns:
        True when this scheduler won it; False when another scheduler took it first.
    """
    owned_by = Attempt.scheduler_id.is_(None) if old_owner is None else Attempt.scheduler_id == old_owner
    result = cast(CursorResult[Any], session.execute(
        update(Attempt).where(Attempt.id == attempt_id, owned_by).values(scheduler_id=me.id)
    ))
    return result.rowcount == 1


def to_supervise(session: Session, me: Identity, now: float | None = None) -> tuple[list[int], list[tuple[Owned, str]]]:
    """The active runs this scheduler supervises this tick, taking over those of dead schedulers.

    Returns:
        The run ids (oldest first), and the take-overs made (the run, and who owned it, in words)
        for the caller to tell; the caller commits.
    """
    now = time.time() if now is None else now
    runs = active_runs(session)
    owners = {o for o in (r.owner for r in runs) if o is not None and o != me.id}
    leases = {h.id: h for h in session.scalars(
        select(SchedulerHeartbeat).where(SchedulerHeartbeat.id.in_(owners)))} if owners else {}
    mine: list[int] = []
    taken: list[tuple[Owned, str]] = []
    for run in runs:
        if run.attempt_id is None or run.owner == me.id:
            mine.append(run.run_id)  # no attempt at all: the supervision ends it (db edited by hand)
            continue
        lease = leases.get(run.owner) if run.owner is not None else None
        if run.owner is not None and not presumed_dead(me, lease, now):
            continue  # another live scheduler's
        if take_over(session, run.attempt_id, run.owner, me):
            mine.append(run.run_id)
            if run.owner is not None:
                taken.append((run, describe(run.owner, lease, now)))
    return mine, taken


def describe(owner_id: int, lease: SchedulerHeartbeat | None, now: float) -> str:
    """An earlier owner, in words, for the take-over's event."""
    if lease is None:
        return f"scheduler #{owner_id} (its lease row is gone)"
    return (f"scheduler #{owner_id} (pid {lease.pid} on {lease.host}, last seen {now - lease.beat_at:.0f} s ago)")


def on_this_host(host: str) -> Any:
    """A condition on attempts: launched by a scheduler on ``host``, or by one from before leases
    (NULL owner, which could only be this host's). Used to count the devices in use here."""
    here = select(SchedulerHeartbeat.id).where(SchedulerHeartbeat.host == host)
    return or_(Attempt.scheduler_id.is_(None), Attempt.scheduler_id.in_(here))


def other_live_scheduler(session: Session, me: Identity, now: float | None = None) -> SchedulerHeartbeat | None:
    """Another scheduler whose lease is live (not ``me``, not a dead one of this data folder).

    ``me.id`` may be 0 for a scheduler that has no lease row yet."""
    now = time.time() if now is None else now
    for lease in session.scalars(select(SchedulerHeartbeat).where(
            SchedulerHeartbeat.id != me.id, SchedulerHeartbeat.beat_at >= now - LEASE_S)):
        if not presumed_dead(me, lease, now):
            return lease
    return None


def renew(session: Session, scheduler_id: int, every_s: float, now: float | None = None) -> bool:
    """Renew a lease that has not been renewed for ``every_s`` (the caller commits): the
    scheduler's own job does it beside the tick, so that a long tick does not let it expire.

    Returns:
        Whether a write was made.
    """
    now = time.time() if now is None else now
    result = cast(CursorResult[Any], session.execute(
        update(SchedulerHeartbeat)
        .where(SchedulerHeartbeat.id == scheduler_id, SchedulerHeartbeat.beat_at < now - every_s)
        .values(beat_at=now)
    ))
    return result.rowcount == 1
