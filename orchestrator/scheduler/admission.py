"""Admission: which queued or retrying runs the scheduler launches now, and what a run that must
wait says it waits for.

Local runs wait for this machine's devices (CPU slots or GPUs, counted over the running local
attempts on this host), first come first served: a big run is not overtaken. Slurm runs wait
only for room under runyard's cap on its jobs in the cluster's queue (``RUNYARD_SLURM_MAX_JOBS``);
Slurm itself admits them to nodes. A retry after a full disk waits for room on its filesystem.
A collaborator of :class:`~orchestrator.scheduler.loop.Scheduler`: its tick calls :meth:`Admission.admit`,
which hands each run that may start to the scheduler's launch.
"""

from __future__ import annotations

import errno
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db import lease
from db.models import Attempt, Checkpoint, Event, Run
from db.states import ACTIVE, AttemptStatus, RunStatus
from db.vocabulary.causes import Cause
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import EnvSettings
from orchestrator.scheduler.storage import errno_in, free_bytes, human_bytes, writable_problem

logger = logging.getLogger(__name__)

# After a DISK failure the run is retried only when its filesystem has at least this much free
# (or twice its largest checkpoint, if more); it looks again this often.
DISK_MIN_FREE_BYTES = 512 * 2**20
DISK_RECHECK_S = 10.0


def slurm_max_jobs() -> int:
    """Jobs runyard keeps in the Slurm queue at most, pending or running: RUNYARD_SLURM_MAX_JOBS
    (db/vocabulary/settings.py, default 16; the scheduler checked it when it started)."""
    return EnvSettings.from_env().slurm_max_jobs


# Launches a run's next attempt on the given GPU indices (none: CPU slots, or Slurm's own).
Launch = Callable[[Session, Run, list[int]], None]


def current_attempt(session: Session, run: Run) -> Attempt | None:
    """The run's newest attempt, or None before its first."""
    return session.execute(
        select(Attempt).where(Attempt.run_id == run.id).order_by(Attempt.number.desc()).limit(1)
    ).scalar_one_or_none()


class Admission:
    """Which runs start now, and what a run that must wait says; each one that may start goes to
    ``launch`` (the scheduler's), which may still lose it to another scheduler."""

    def __init__(self, inventory: Inventory, host: str, launch: Launch) -> None:
        self.inventory = inventory
        self.host = host
        self.launch = launch

    def used_devices(self, session: Session) -> tuple[int, set[int]]:
        """(slots, GPU indices) held by running local attempts on this host."""
        rows = session.execute(
            select(Run.nproc, Attempt.devices_json)
            .join(Attempt, Attempt.run_id == Run.id)
            .where(Run.status.in_([s.value for s in ACTIVE]), Attempt.status == AttemptStatus.RUNNING.value,
                   Attempt.executor == "local", lease.on_this_host(self.host))
        ).all()
        used_slots = sum(n for n, _ in rows)
        used_gpus = {int(d) for _, devs in rows for d in json.loads(devs or "[]")}
        return used_slots, used_gpus

    def admit(self, session: Session) -> None:
        """Launch runs while they fit: retries whose backoff is over first (they held devices
        already), then queued runs oldest first (no overtaking: big runs don't starve).

        Local runs wait for this machine's devices; Slurm runs for room under runyard's cap on
        its jobs in the cluster's queue (Slurm itself admits them to nodes). The two queues do
        not block each other.
        """
        now = time.time()
        retrying = session.execute(
            select(Run).where(Run.status == RunStatus.RETRYING.value, Run.retry_at <= now).order_by(Run.retry_at)
        ).scalars().all()
        queued = session.execute(
            select(Run).where(Run.status == RunStatus.QUEUED.value).order_by(Run.id)
        ).scalars().all()
        local_blocked = slurm_blocked = False
        for i, run in enumerate([*retrying, *queued]):
            if run.status == RunStatus.RETRYING.value and not self._room_to_retry(session, run, now):
                continue  # it waits for disk space without holding devices; others may go
            if run.executor == "slurm":
                if slurm_blocked or not self._slurm_room(session, run):
                    slurm_blocked = True
                    continue
                self.launch(session, run, [])
                continue
            if local_blocked:
                continue
            used_slots, used_gpus = self.used_devices(session)
            if used_slots + run.nproc > self.inventory.slots:
                self._say_why_waiting(session, [r for r in [*retrying, *queued][i:]
                                                if r.status == RunStatus.QUEUED.value and r.nproc > 0
                                                and r.executor == "local"],
                                      used_slots)
                local_blocked = True
                continue
            devices: list[int] = []
            if self.inventory.kind == "gpu":
                devices = [i for i in range(self.inventory.slots) if i not in used_gpus][: run.nproc]
            self.launch(session, run, devices)

    def _slurm_room(self, session: Session, run: Run) -> bool:
        """Whether runyard may put another job in the Slurm cluster's queue (RUNYARD_SLURM_MAX_JOBS
        of its jobs at most, pending or running, across every scheduler of this database); a run
        that must wait says so."""
        cap = slurm_max_jobs()
        active = session.scalar(
            select(func.count()).select_from(Attempt).join(Run, Run.id == Attempt.run_id)
            .where(Attempt.executor == "slurm", Attempt.status == AttemptStatus.RUNNING.value,
                   Run.status.in_([s.value for s in ACTIVE]))) or 0
        if active < cap:
            return True
        reason = (f"queued: runyard keeps at most {cap} job(s) in the Slurm queue ({active} there now; "
                  "RUNYARD_SLURM_MAX_JOBS sets the cap)")
        if run.status == RunStatus.QUEUED.value and run.status_reason != reason:
            run.status_reason = reason
        return False

    def _say_why_waiting(self, session: Session, waiting: list[Run], used_slots: int) -> None:
        """A queued run that cannot start says what it waits for: the devices held by the active
        runs, or the runs queued before it (no overtaking). Written only when it changes."""
        unit = "GPU(s)" if self.inventory.kind == "gpu" else "CPU slot(s)"
        holders = session.scalars(
            select(Run.id).join(Attempt, Attempt.run_id == Run.id)
            .where(Run.status.in_([s.value for s in ACTIVE]), Attempt.status == AttemptStatus.RUNNING.value,
                   lease.on_this_host(self.host))
            .distinct().order_by(Run.id)).all()
        held_by = f" by run(s) {', '.join(f'#{h}' for h in holders)}" if holders else ""
        for position, run in enumerate(waiting):
            if run.nproc > self.inventory.slots:
                reason = (f"cannot start: needs {run.nproc} {unit}, this machine has {self.inventory.slots}; "
                          "cancel it and submit it with fewer ranks")
            elif position == 0:
                reason = (f"queued: waiting for {run.nproc} free {unit} ({used_slots} of {self.inventory.slots} "
                          f"in use{held_by})")
            else:
                reason = (f"queued: waiting behind {position} earlier run(s) "
                          f"({', '.join(f'#{r.id}' for r in waiting[:position][:5])}), first come first served")
            if run.status_reason != reason:
                run.status_reason = reason

    def _room_to_retry(self, session: Session, run: Run, now: float) -> bool:
        """After a DISK failure, retry only when the run's folder can be written (a read-only
        mount) and its filesystem has room for a checkpoint again: max(DISK_MIN_FREE_BYTES, twice
        the run's largest checkpoint). Until then the run stays RETRYING, says what it waits for,
        and looks again every DISK_RECHECK_S."""
        previous = current_attempt(session, run)
        if previous is None or previous.cause != Cause.DISK.value:
            return True
        problem = writable_problem(Path(run.run_dir))
        if problem is not None:
            reason = (f"waiting for the run folder to be writable again: {problem.describe()}; the retry starts "
                      f"once it is (checked every {DISK_RECHECK_S:.0f} s)")
            return self._wait_for_storage(session, run, previous, reason, now)
        if errno_in(previous.exception) == errno.EROFS:
            return True  # a mount that was read-only says nothing about the room on it
        largest = session.scalar(select(func.max(Checkpoint.bytes)).where(Checkpoint.run_id == run.id)) or 0
        need = max(DISK_MIN_FREE_BYTES, 2 * int(largest))
        free = free_bytes(Path(run.run_dir))
        if free is None or free >= need:
            return True
        reason = (f"waiting for disk space: {human_bytes(free)} free on the filesystem of {run.run_dir}, "
                  f"{human_bytes(need)} needed (twice the largest checkpoint, at least "
                  f"{human_bytes(DISK_MIN_FREE_BYTES)}); the retry starts once there is room")
        return self._wait_for_storage(session, run, previous, reason, now)

    @staticmethod
    def _wait_for_storage(session: Session, run: Run, previous: Attempt, reason: str, now: float) -> bool:
        """Keep the run RETRYING with ``reason``, said once (an event and a log line) and looked
        at again in DISK_RECHECK_S. Returns False (not yet)."""
        if (run.status_reason or "").split(":")[0] != reason.split(":")[0]:
            session.add(Event(run_id=run.id, attempt=previous.number, at=now, level="warning", kind="disk",
                              message=reason))
            logger.warning("run %d: %s", run.id, reason)
        run.status_reason = reason
        run.retry_at = now + DISK_RECHECK_S
        return False
