"""What a read costs the database, counted statement by statement, and the per-run computation the
Runs list did before it read every run at once (kept as ``reference_summary``, what its answer
must equal).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from db import estimates, metricstore, run_summary
from db.energy import energies
from db.models import Attempt, Checkpoint, Run, Sweep, SweepTrial
from db.states import TERMINAL, RunStatus
from db.vocabulary.cost import ETA_WINDOW, AttemptSpan, cost_usd, wasted_seconds
from db.vocabulary.eta import forecast, restart_ahead
from db.vocabulary.settings import load_settings
from db.vocabulary.your_cost import cost_lines, own_price

# --- the per-run computation list_runs used to do, one run at a time (3-4 statements a run) ----


def reference_summary(session: Session, run: Run, now: float) -> dict[str, Any]:
    """One run's summary the way db.queries computed it before it was batched."""
    attempts = session.execute(
        select(Attempt).where(Attempt.run_id == run.id).order_by(Attempt.number)
    ).scalars().all()
    status = RunStatus(run.status)
    resume = session.get(Checkpoint, run.resume_checkpoint_id) if run.resume_checkpoint_id is not None else None
    step = run_summary.lineage_step(status, attempts, resume.step if resume else None, run.parent_step)
    if status is RunStatus.SUCCEEDED and run.max_steps and abs(step - run.max_steps) == 1:
        step = run.max_steps
    eta: float | None
    estimate = None
    if status is RunStatus.SUCCEEDED:
        eta = 0.0
    elif status in TERMINAL or status is RunStatus.QUEUED or not attempts or not run.max_steps:
        eta = None
    else:
        key = metricstore.progress_key(session, run.id, attempts[-1].number) or "loss"
        rows = metricstore.recent(session, run.id, key, attempt=attempts[-1].number, rank=0, limit=ETA_WINDOW)
        usable = session.scalar(select(func.max(Checkpoint.step)).where(
            Checkpoint.run_id == run.id, Checkpoint.verified, ~Checkpoint.deleted, Checkpoint.refused_reason.is_(None)))
        restart = restart_ahead(run.status, [(a.number, a.first_step_at - a.started_at) for a in attempts
                                             if a.first_step_at is not None],
                                run.retry_at, now, estimates.machine_startups(session), usable)
        estimate = forecast([(int(s), float(t)) for s, _, t in rows], run.max_steps, restart)
        eta = estimate.seconds if estimate else None
    cost = cost_usd([(a.started_at, a.ended_at) for a in attempts], run.price_usd_per_hour, now)
    written = dict(session.execute(
        select(Checkpoint.attempt, func.max(Checkpoint.created_at)).where(Checkpoint.run_id == run.id)
        .group_by(Checkpoint.attempt)
    ).all())
    spans = [AttemptSpan(started_at=a.started_at, ended_at=a.ended_at, first_step_at=a.first_step_at,
                         failed=a.cause is not None and a.cause != "PREEMPTED",
                         last_checkpoint_at=written.get(a.number),
                         after_failure=i > 0 and attempts[i - 1].cause is not None)
             for i, a in enumerate(attempts)]
    wasted = wasted_seconds(spans, now) * run.price_usd_per_hour / 3600.0
    projected = cost + (eta or 0.0) * run.price_usd_per_hour / 3600.0 if status not in TERMINAL else cost
    summary: dict[str, Any] = {
        "id": run.id, "name": run.name, "status": run.status, "status_reason": run.status_reason,
        "tags": json.loads(run.tags_json or "[]"), "step": step, "max_steps": run.max_steps,
        "progress": min(1.0, step / run.max_steps) if run.max_steps else 0.0, "nproc": run.nproc,
        "executor": run.executor, "job_id": attempts[-1].job_id if attempts else None,
        "job_state": attempts[-1].job_state if attempts else None,
        "created_at": run.created_at, "started_at": run.started_at, "ended_at": run.ended_at,
        "elapsed_s": run_summary.elapsed_s(run, attempts, now),
        "attempt_count": len(attempts), "cost_usd": round(cost, 6), "cost_wasted_usd": round(wasted, 6),
        "cost_projected_usd": round(projected, 6), "price_usd_per_hour": run.price_usd_per_hour,
        "price_unit": run.price_unit, "eta_s": eta,
        "eta_range_s": (estimate.low, estimate.high) if estimate else None,
        "eta_basis": estimate.basis if estimate else None, "parent_run_id": run.parent_run_id,
        "parent_step": run.parent_step, "resume_checkpoint_id": run.resume_checkpoint_id,
        "retries_used": run.retries_used, "retry_at": run.retry_at, "starred": run.starred,
        "archived": run.archived, "note": run.note, "trial": _trial(session, run.id),
        "energy": energies(session, {run.id: [a.number for a in attempts]})[0][run.id],
        "start_estimate": _start(session, run, now),
    }
    # The two cost lines from the summary's own keys, at the owner's price as it is today.
    return summary | {"cost": cost_lines(summary, spans, own_price(load_settings().home), now)}


def _start(session: Session, run: Run, now: float) -> dict[str, Any] | None:
    """A queued run's start estimate, the whole queue read for it alone."""
    if run.status != RunStatus.QUEUED.value:
        return None
    return estimates.queue_starts(session, now, estimates.published_machine())[run.id].as_dict()


def _trial(session: Session, run_id: int) -> dict[str, Any] | None:
    """The sweep and number of the trial that run ``run_id`` is, if it is one."""
    trial = session.scalar(select(SweepTrial).where(SweepTrial.run_id == run_id))
    if trial is None:
        return None
    sweep = session.get_one(Sweep, trial.sweep_id)
    return {"sweep_id": sweep.id, "sweep_name": sweep.name, "number": trial.number}


# --- counting statements ------------------------------------------------------------------------


@pytest.fixture
def statements() -> Iterator[list[tuple[Engine, str]]]:
    """Every statement any engine sends while the test runs, with the engine that sent it (the
    CLI builds its own engine, so the listener is on the Engine class)."""
    sent: list[tuple[Engine, str]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        sent.append((conn.engine, statement))

    event.listen(Engine, "before_cursor_execute", record)
    yield sent
    event.remove(Engine, "before_cursor_execute", record)


def counted(sessions: sessionmaker[Session], statements: list[tuple[Engine, str]],
            read: Callable[[Session], Any]) -> tuple[Any, list[str]]:
    """``read`` in a new session, and the statements it sent."""
    with sessions() as s:
        start = len(statements)
        result = read(s)
        return result, [sql for _, sql in statements[start:]]
