"""Where a run's time goes: its goodput (productive step time over wall time) and the parts of the
rest, and the checkpoint interval Young–Daly recommends for it."""

from __future__ import annotations

import json
import time
from itertools import pairwise
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db import metricstore
from db.models import Attempt, Checkpoint, Run
from db.requests import RunNotFound
from db.run_summary import lineage_cutoffs
from db.vocabulary.causes import INTERRUPTIONS
from db.vocabulary.cost import (
    young_daly_interval_s,
)


def goodput(session: Session, run: Run, attempts: list[dict[str, Any]], now: float | None = None) -> float | None:
    """Productive step time over wall time: the steps on the run's lineage times the mean step
    time, divided by the time the run held its devices or waited to retry (failures, restarts,
    backoff and lost steps all lower it; a pause chosen by the person does not)."""
    if not attempts:
        return None
    now = time.time() if now is None else now
    cutoffs = lineage_cutoffs(attempts)
    total, count = 0.0, 0
    for a in attempts:  # rank 0's step times along the lineage, from the rollups
        s, n = metricstore.totals(session, run.id, "step_time", attempt=a["number"], rank=0,
                                  max_step=cutoffs.get(a["number"]))
        total, count = total + s, count + n
    last = attempts[-1]
    steps: int = last["last_step"] or last["resume_step"] or 0
    wall: float = sum((a["ended_at"] or now) - a["started_at"] for a in attempts)
    wall += sum(b["started_at"] - (a["ended_at"] or b["started_at"]) for a, b in pairwise(attempts) if a["cause"])
    if not count or wall <= 0:
        return None
    return min(1.0, steps * (total / count) / wall)


def goodput_parts(session: Session, run: Run, attempts: list[dict[str, Any]],
                  now: float | None = None) -> dict[str, float]:
    """Where the run's time went besides its productive steps, as shares of the same wall time
    :func:`goodput` divides by: ``startup`` (launch to first step of each attempt that did not
    follow a failure: imports, rendezvous, data loading, compilation), ``checkpoints`` (the time
    the training loop was blocked by saves), ``failures`` (each recovery's phases, db/vocabulary/phases.py:
    from the failure through teardown, detection, relaunch and the next attempt's start-up to its
    first step; and the steps lost since the last checkpoint) and ``other`` (evaluation, logging,
    slow steps: the rest)."""
    now = time.time() if now is None else now
    wall = sum((a["ended_at"] or now) - a["started_at"] for a in attempts)
    wall += sum(b["started_at"] - (a["ended_at"] or b["started_at"]) for a, b in pairwise(attempts) if a["cause"])
    if wall <= 0:
        return {}
    startup, failures = 0.0, 0.0
    previous: dict[str, Any] | None = None
    for a in attempts:
        ready = a["first_step_at"] or a["ended_at"] or now
        if previous is not None and previous["cause"]:
            # The recovery's phases: the failure (or, without its mark, the exit) to this first step.
            failures += ready - min(previous["failed_at"] or previous["ended_at"] or a["started_at"], a["started_at"])
        else:
            startup += ready - a["started_at"]
        previous = a
    blocked = float(session.scalar(select(func.coalesce(func.sum(Checkpoint.blocked_s), 0.0))
                                   .where(Checkpoint.run_id == run.id)) or 0.0)
    for a in attempts:
        if a["cause"] and a["first_step_at"] is not None:
            until = a["failed_at"] or a["ended_at"]
            if until is not None:  # the steps lost since the last checkpoint, at this attempt's pace
                failures += max(0.0, until - a["first_step_at"]) * (
                    (a["steps_lost"] or 0) / max(1, (a["last_step"] or 0) - (a["resume_step"] or 0)))
    productive = (goodput(session, run, attempts, now) or 0.0) * wall
    parts = {"startup": startup, "checkpoints": blocked, "failures": failures}
    parts["other"] = max(0.0, wall - productive - sum(parts.values()))
    return {key: min(1.0, value / wall) for key, value in parts.items()}


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def checkpoint_advice(session: Session, run_id: int, now: float | None = None, recent: int = 10) -> dict[str, Any]:
    """The checkpoint interval Young–Daly recommends for this run, beside the configured one.

    - save cost C: the median time the training loop was blocked by the run's ``recent`` newest
      saves (``Checkpoint.blocked_s``; the rest of a save runs in the background);
    - MTBF M: device time of every attempt of every run on this machine over the number of
      attempts that ended by an interruption (``db.vocabulary.causes.INTERRUPTIONS``; cancels
      and pauses have no cause); None before the first one;
    - step time: wall seconds per step of the run's newest attempt that made progress (its
      first to its last reported step), so evaluation and saves are counted as the interval is.

    Returns:
        ``interval_s`` and ``interval_steps`` (None when something is missing, and ``missing``
        then says what, one sentence each), ``checkpoint_cost_s``, ``save_total_s``,
        ``mtbf_s``, ``failures``, ``device_time_s``, ``step_time_s``, and the configured
        ``every_steps`` / ``every_seconds``.
    """
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(f"no run with id {run_id}; `runyard ls` lists the runs")
    now = time.time() if now is None else now
    configured = json.loads(run.config_json).get("checkpoint", {})
    saves = session.execute(
        select(Checkpoint.blocked_s, Checkpoint.total_s).where(Checkpoint.run_id == run_id)
        .order_by(Checkpoint.created_at.desc()).limit(recent)
    ).all()
    cost = _median([b for b, _ in saves if b is not None])
    total = _median([t for _, t in saves if t is not None])

    spans = session.execute(select(Attempt.started_at, Attempt.ended_at, Attempt.cause)).all()
    device_time = sum(max(0.0, (end if end is not None else now) - start) for start, end, _ in spans)
    failures = sum(1 for _, _, cause in spans if cause in INTERRUPTIONS)
    mtbf = device_time / failures if failures else None

    step_time = None
    attempts = session.execute(
        select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.number.desc())
    ).scalars().all()
    for a in attempts:
        steps = (a.last_step or 0) - (a.resume_step or 0) - 1  # first_step_at is the first step's end
        if a.first_step_at is not None and a.progress_at is not None and steps > 0 and a.progress_at > a.first_step_at:
            step_time = (a.progress_at - a.first_step_at) / steps
            break

    missing = []
    if cost is None:
        missing.append("no checkpoint written yet, so the save cost is unknown")
    if mtbf is None:
        missing.append(f"no interruption seen on this machine yet ({device_time / 3600:.1f} h of attempts), "
                       "so the mean time between failures is unknown")
    if step_time is None:
        missing.append("not enough steps yet to measure the step time")
    interval_s = young_daly_interval_s(cost, mtbf) if cost is not None and mtbf is not None else None
    interval_steps = max(1, round(interval_s / step_time)) if interval_s is not None and step_time else None
    return {
        "interval_s": interval_s,
        "interval_steps": interval_steps,
        "checkpoint_cost_s": cost,
        "save_total_s": total,
        "mtbf_s": mtbf,
        "failures": failures,
        "device_time_s": device_time,
        "step_time_s": step_time,
        "every_steps": configured.get("every_steps"),
        "every_seconds": configured.get("every_seconds"),
        "missing": missing,
    }
