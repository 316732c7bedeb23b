"""A run's summary, as the Runs list, ``runyard ls`` and ``runyard show`` give it (its step,
progress, elapsed time, cost, ETA), read for many runs in a fixed number of statements; and where
a run's lineage goes (the step it is at, the steps of each attempt still on it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from sqlalchemy import Row, and_, case, func, select
from sqlalchemy.orm import Session
from typing_extensions import Unpack

from db import metricstore
from db.energy import energies
from db.estimates import holding_runs, machine_startups, published_machine, queue_starts
from db.models import Attempt, Checkpoint, Run, Sweep, SweepTrial
from db.states import TERMINAL, RunStatus
from db.vocabulary.causes import Cause
from db.vocabulary.cost import (
    ETA_WINDOW,
    AttemptSpan,
    cost_usd,
    wasted_seconds,
)
from db.vocabulary.eta import Forecast, forecast, restart_ahead
from db.vocabulary.settings import load_settings
from db.vocabulary.your_cost import OwnPrice, cost_lines, own_price

# The run and attempt columns a summary reads: not the config, log tails or exceptions, which
# a list of 200 runs would otherwise carry from the database for nothing.
_RUN_COLUMNS = (
    Run.id, Run.name, Run.status, Run.status_reason, Run.tags_json, Run.max_steps, Run.nproc, Run.created_at,
    Run.started_at, Run.ended_at, Run.price_usd_per_hour, Run.price_unit, Run.parent_run_id, Run.parent_step,
    Run.resume_checkpoint_id, Run.retries_used, Run.retry_at, Run.executor, Run.starred, Run.archived, Run.note,
)
_ATTEMPT_COLUMNS = (
    Attempt.run_id, Attempt.number, Attempt.started_at, Attempt.ended_at, Attempt.first_step_at, Attempt.last_step,
    Attempt.resume_step, Attempt.cause, Attempt.job_id, Attempt.job_state,
)
ETA_POINTS = ETA_WINDOW  # rank 0's newest points of its progress metric the ETA is projected from

# A row of any columns (typing.Unpack is Python 3.11+; typing_extensions comes with pydantic); a run
# as _run_summary reads it: an ORM Run, or a row of _RUN_COLUMNS.
AnyRow = Row[Unpack[tuple[Any, ...]]]
RunLike = Run | AnyRow


def _run_summaries(session: Session, runs: Sequence[RunLike], now: float) -> list[dict[str, Any]]:
    """The summary of each run (what ``runyard ls`` and the Runs page show), read in the same
    few statements however many runs there are: every attempt of the runs at once, their
    newest checkpoint time per attempt at once, and the live runs' newest loss points at once.

    Args:
        session: Where to read.
        runs: The runs, as ORM objects or rows of ``_RUN_COLUMNS``.
        now: The time that running attempts, elapsed time and cost are counted up to.

    Returns:
        One dict per run, in the order of ``runs``.
    """
    ids = [r.id for r in runs]
    attempts: dict[int, list[AnyRow]] = {run_id: [] for run_id in ids}
    if ids:
        for a in session.execute(
            select(*_ATTEMPT_COLUMNS).where(Attempt.run_id.in_(ids)).order_by(Attempt.run_id, Attempt.number)
        ):
            attempts[a.run_id].append(a)
    written: dict[tuple[int, int], float] = {}
    usable: dict[int, int] = {}  # the step of each run's newest usable checkpoint: where a retry resumes
    if with_attempts := [run_id for run_id in ids if attempts[run_id]]:
        ok = and_(Checkpoint.verified, ~Checkpoint.deleted, Checkpoint.refused_reason.is_(None))
        rows = session.execute(
            select(Checkpoint.run_id, Checkpoint.attempt, func.max(Checkpoint.created_at),
                   func.max(case((ok, Checkpoint.step))))
            .where(Checkpoint.run_id.in_(with_attempts))
            .group_by(Checkpoint.run_id, Checkpoint.attempt)
        )
        for run_id, attempt, at, step in rows:
            written[(run_id, attempt)] = at
            if step is not None:
                usable[run_id] = max(step, usable.get(run_id, step))
    # Only a run that is still going has an ETA to project, from its newest attempt's rank 0 (the
    # steps of its loss, or of whatever metric it reports: metricstore.progress_key); a run queued
    # to resume has none until its new attempt trains (its old pace ended elsewhere).
    live = [(r.id, attempts[r.id][-1].number, 0) for r in runs
            if attempts[r.id] and RunStatus(r.status) not in TERMINAL and RunStatus(r.status) is not RunStatus.QUEUED]
    # A queued run's start comes from the predicted ends of the runs holding devices: their points
    # are read with the live runs' (db/estimates.py queue_starts).
    queued = any(r.status == RunStatus.QUEUED.value for r in runs)
    machine = published_machine() if queued else None
    holding = holding_runs(session) if machine is not None else []
    live += sorted({(h.id, h.number, 0) for h in holding} - set(live))
    points = metricstore.recent_progress(session, live, limit=ETA_POINTS)
    # A run queued to resume from a checkpoint is at that checkpoint's step, not where it stopped.
    resumes = {r.resume_checkpoint_id for r in runs if r.resume_checkpoint_id is not None}
    resume_steps: dict[int, int] = dict(session.execute(
        select(Checkpoint.id, Checkpoint.step).where(Checkpoint.id.in_(resumes))).all()) if resumes else {}
    trials = _trials(session, ids)
    energy, attempt_energy = energies(session, {run_id: [a.number for a in attempts[run_id]] for run_id in ids})
    restarting = any(RunStatus(r.status) in (RunStatus.RETRYING, RunStatus.PAUSING) for r in runs)
    restarts = machine_startups(session) if restarting else []
    starts = queue_starts(session, now, machine, holding, points) if queued else {}
    summaries = [
        _run_summary(r, attempts[r.id], written,
                     points.get((r.id, attempts[r.id][-1].number, 0), []) if attempts[r.id] else [], now,
                     resume_steps.get(r.resume_checkpoint_id) if r.resume_checkpoint_id is not None else None,
                     restarts, usable.get(r.id))
        | {"trial": trials.get(r.id), "energy": energy[r.id],
           "start_estimate": starts[r.id].as_dict() if r.id in starts else None}
        for r in runs
    ]
    # Last, once every other key (the energy among them) is in: the two cost lines, at today's own price.
    price = own_price(load_settings().home) if summaries else OwnPrice()
    for summary in summaries:
        run_attempts = attempts[summary["id"]]
        summary["cost"] = cost_lines(summary, _attempt_spans(run_attempts, written), price, now,
                                     [attempt_energy[(summary["id"], a.number)]["kwh"] for a in run_attempts])
    return summaries


def _trials(session: Session, run_ids: list[int]) -> dict[int, dict[str, Any]]:
    """The runs that are a sweep's trials: ``{"sweep_id", "sweep_name", "number"}`` by run id."""
    if not run_ids:
        return {}
    rows = session.execute(select(SweepTrial.run_id, SweepTrial.sweep_id, Sweep.name, SweepTrial.number)
                           .join(Sweep, Sweep.id == SweepTrial.sweep_id).where(SweepTrial.run_id.in_(run_ids)))
    return {run_id: {"sweep_id": sweep_id, "sweep_name": name, "number": number}
            for run_id, sweep_id, name, number in rows if run_id is not None}


def lineage_step(status: RunStatus, attempts: Sequence[Any], resume_step: int | None,
                 parent_step: int | None) -> int:
    """The step a run is at on its lineage: the step its pending resume starts from (a run queued
    to resume from step 5000 is at 5000, not at the 10000 it had reached); else its newest
    attempt's (an older one may have got further before the run was resumed from an earlier
    checkpoint); else, for a fork that has not started, its parent's step; else 0."""
    if status is RunStatus.QUEUED and resume_step is not None:
        return resume_step
    if attempts:
        return attempts[-1].last_step or attempts[-1].resume_step or 0
    return parent_step or 0


def elapsed_s(run: RunLike, attempts: Sequence[Any], now: float) -> float | None:
    """How long the run has been at work: its attempts' time (launch to end, or to ``now``) plus
    the waits before retries (the backoff after a failure, the current one included), never the
    time it sat paused, cancelled or finished before a person resumed it. None before it started."""
    if not attempts:
        return ((run.ended_at or now) - run.started_at) if run.started_at else None
    held: float = sum((a.ended_at or now) - a.started_at for a in attempts)
    waits: float = sum(b.started_at - (a.ended_at or b.started_at) for a, b in pairwise(attempts) if a.cause)
    last = attempts[-1]
    if RunStatus(run.status) is RunStatus.RETRYING and last.ended_at is not None:
        waits += max(0.0, now - last.ended_at)
    return held + waits


def _run_summary(run: RunLike, attempts: list[AnyRow], written: dict[tuple[int, int], float],
                 recent_loss: list[tuple[int, float, float]], now: float,
                 resume_step: int | None = None, machine: list[float] | None = None,
                 usable_step: int | None = None) -> dict[str, Any]:
    """One run's summary from what :func:`_run_summaries` read: its attempts (oldest first), the
    newest checkpoint time per (run, attempt), rank 0's newest loss points of its newest attempt
    (newest first), the step of the checkpoint a pending resume starts from, the machine's newest
    restarts' start-up times and the step of the run's newest usable checkpoint."""
    status = RunStatus(run.status)
    step = lineage_step(status, attempts, resume_step, run.parent_step)
    if status is RunStatus.SUCCEEDED and run.max_steps and abs(step - run.max_steps) == 1:
        # Done, by a script that numbers its steps from 0 (Lightning's WandbLogger: last step 2999 of
        # 3000) or runs its loop to max_steps inclusive (nanoGPT's 1501 of 1500): shown as complete.
        step = run.max_steps
    eta: float | None
    estimate: Forecast | None = None
    if status is RunStatus.SUCCEEDED:
        eta = 0.0
    elif status in TERMINAL or status is RunStatus.QUEUED or not attempts or not run.max_steps:
        eta = None
    else:
        startups = [(a.number, a.first_step_at - a.started_at) for a in attempts if a.first_step_at is not None]
        restart = restart_ahead(status, startups, run.retry_at, now, machine or [], usable_step)
        estimate = forecast([(int(s), float(t)) for s, _, t in recent_loss], run.max_steps, restart)
        eta = estimate.seconds if estimate is not None else None
    spans = [(a.started_at, a.ended_at) for a in attempts]
    cost = cost_usd(spans, run.price_usd_per_hour, now)
    wasted = wasted_seconds(_attempt_spans(attempts, written), now) * run.price_usd_per_hour / 3600.0
    projected = cost + (eta or 0.0) * run.price_usd_per_hour / 3600.0 if status not in TERMINAL else cost
    return {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "status_reason": run.status_reason,
        "tags": json.loads(run.tags_json or "[]"),
        "step": step,
        "max_steps": run.max_steps,
        "progress": min(1.0, step / run.max_steps) if run.max_steps else 0.0,
        "nproc": run.nproc,
        "executor": run.executor or "local",
        "job_id": attempts[-1].job_id if attempts else None,
        "job_state": attempts[-1].job_state if attempts else None,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "elapsed_s": elapsed_s(run, attempts, now),
        "attempt_count": len(attempts),
        "cost_usd": round(cost, 6),
        "cost_wasted_usd": round(wasted, 6),
        "cost_projected_usd": round(projected, 6),
        "price_usd_per_hour": run.price_usd_per_hour,
        "price_unit": run.price_unit,
        "eta_s": eta,
        "eta_range_s": (estimate.low, estimate.high) if estimate is not None else None,
        "eta_basis": estimate.basis if estimate is not None else None,
        "parent_run_id": run.parent_run_id,
        "parent_step": run.parent_step,
        "resume_checkpoint_id": run.resume_checkpoint_id,
        "retries_used": run.retries_used,
        "retry_at": run.retry_at,
        "starred": bool(run.starred),
        "archived": bool(run.archived),
        "note": run.note,
    }


def _attempt_spans(attempts: list[AnyRow], written: dict[tuple[int, int], float]) -> list[AttemptSpan]:
    """The cost arithmetic's view of one run's attempts (oldest first), with ``written`` the
    newest checkpoint time per (run, attempt)."""
    spans = []
    for i, a in enumerate(attempts):
        spans.append(AttemptSpan(
            started_at=a.started_at, ended_at=a.ended_at, first_step_at=a.first_step_at,
            failed=a.cause is not None and a.cause != Cause.PREEMPTED,
            last_checkpoint_at=written.get((a.run_id, a.number)),
            after_failure=i > 0 and attempts[i - 1].cause is not None,
        ))
    return spans


RUN_COLUMNS = _RUN_COLUMNS  # what run_summaries reads of a run (db/compare.py selects them with more)


def run_summaries(session: Session, runs: Sequence[RunLike], now: float) -> list[dict[str, Any]]:
    """The summary of each of ``runs`` (rows of ``RUN_COLUMNS``) as :func:`list_runs` gives it,
    in a fixed number of statements (see :func:`_run_summaries`)."""
    return _run_summaries(session, runs, now)


def lineage_cutoffs(attempts: list[dict[str, Any]]) -> dict[int, float]:
    """For each attempt, the last step that is still part of the run's lineage.

    When attempt b starts from step r (a checkpoint, or 0 from scratch), what earlier attempts
    did after step r was abandoned: it is shown as superseded, not mixed into the curves.
    """
    cutoffs: dict[int, float] = {}
    later_min = float("inf")
    for a in sorted(attempts, key=lambda a: a["number"], reverse=True):
        cutoffs[a["number"]] = later_min
        later_min = min(later_min, a["resume_step"] or 0)
    return cutoffs
