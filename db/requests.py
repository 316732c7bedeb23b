"""Requests the UI and the CLI write: a new QUEUED run, a cancel. They never touch processes;
the scheduler acts on what they write."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from db import DatabaseError
from db.models import Event, Run, RunStatusHistory
from db.states import ACTIVE, TERMINAL, RunStatus, transition
from trainer.config import RunConfig


class RunNotFound(DatabaseError):
    """No run matches the reference a person gave."""


@dataclass(frozen=True)
class Price:
    """A price snapshotted on the run at submit time."""

    usd_per_hour: float
    unit: str


def create_run(session: Session, config: RunConfig, runs_dir: Path, price: Price) -> Run:
    """Insert a QUEUED run and write its config.json; the caller commits."""
    now = time.time()
    run = Run(
        name=config.name,
        status=RunStatus.QUEUED.value,
        status_reason="submitted",
        config_json=config.to_json(),
        config_hash=config.config_hash(),
        tags_json=json.dumps(list(config.tags)),
        max_steps=config.train.max_steps,
        nproc=config.launch.nproc_per_node,
        price_usd_per_hour=price.usd_per_hour,
        price_unit=price.unit,
        created_at=now,
        updated_at=now,
    )
    session.add(run)
    session.flush()
    run_dir = runs_dir / f"run-{run.id:06d}"
    run.run_dir = str(run_dir)
    session.add(
        RunStatusHistory(run_id=run.id, from_status=None, to_status=run.status, reason="submitted", at=now)
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config.model_dump(mode="json"), indent=2))
    return run


def request_cancel(session: Session, run_id: int, who: str = "user") -> str:
    """Ask for a run to be cancelled; the caller commits.

    A queued or retrying run is cancelled at once (no process to stop); an active one moves to
    CANCELLING and the scheduler stops its processes.

    Returns:
        A sentence for the person saying what happened.
    """
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(f"run {run_id} does not exist")
    status = RunStatus(run.status)
    if status in TERMINAL:
        return f"run {run_id} is already {status.value}; nothing to cancel"
    if status in (RunStatus.QUEUED, RunStatus.RETRYING):
        moved = transition(session, run_id, RunStatus.CANCELLED, f"cancelled by {who} before launch")
    elif status in ACTIVE and status is not RunStatus.CANCELLING:
        moved = transition(session, run_id, RunStatus.CANCELLING, f"cancel requested by {who}")
    else:
        return f"run {run_id} is already being cancelled"
    if not moved:
        return f"run {run_id} changed status meanwhile; look again with `runyard show {run_id}`"
    session.add(Event(run_id=run_id, at=time.time(), kind="cancel", message=f"cancel requested by {who}"))
    return f"run {run_id}: cancel requested"
