"""A trial's objective: the sweep's metric, rank 0's value or the mean over the ranks that logged
it, at the largest step logged at or before the step that matters (a rung's verified checkpoint,
the trial's end), read from the metric store; and which metrics a built-in workload records, so
that a sweep of one over a metric it never records is refused before anything is queued.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db import metricstore
from db.models import Checkpoint
from db.vocabulary.config import RunConfig, ScriptWorkload
from db.vocabulary.config.sweep import SweepConfig

# What the built-in workloads record (trainer/reporting/monitoring.py's Interval.report every
# train.log_every steps on every rank, their evaluation every train.eval_every steps and at the
# last step on rank 0), by kind; a metric that needs a GPU or fp16 is left out (not on every machine).
STEP_METRICS = ("loss", "lr", "grad_norm", "step_time", "data_wait_s", "compute_s", "samples_per_s")
EVAL_METRICS = ("eval_loss", "eval_accuracy")
KIND_METRICS = {"mlp-digits": ("epoch", "mfu"), "gpt-char": ("tokens_per_s", "mfu")}


def recorded(kind: str) -> tuple[str, ...]:
    """The metrics a built-in workload ``kind`` records on any machine."""
    return (*STEP_METRICS, *EVAL_METRICS, *KIND_METRICS.get(kind, ()))


def metric_problems(base: RunConfig, sweep: SweepConfig, rungs: Sequence[int]) -> list[str]:
    """Why ``sweep.metric`` cannot be read for trials of ``base``: a metric the built-in workload
    never records, or one it records too rarely to have a value by the first rung. A script's
    metrics are its own: any name is taken (its value is read from whatever it reports)."""
    if isinstance(base.workload, ScriptWorkload):
        return []
    kind, metric = base.workload.kind, sweep.metric
    if metric not in recorded(kind):
        return [f"sweep.metric = {metric!r}: the {kind} workload never records it; it records "
                f"{', '.join(recorded(kind))}"]
    if not rungs:
        return []
    evaluated = metric in EVAL_METRICS
    key, every = ("train.eval_every", base.train.eval_every) if evaluated else ("train.log_every", base.train.log_every)
    if every == 0 or every > rungs[0]:
        when = "only at the last step" if every == 0 else f"first at step {every}"
        return [f"sweep.metric = {metric!r} is recorded {when} ({key} = {every}): no value by the first rung "
                f"(step {rungs[0]}); set {key} to at most {rungs[0]} (a divisor of it reads the rung's own step)"]
    return []


def value_at(session: Session, run_id: int, metric: str, step: float, ranks: str) -> tuple[int, float] | None:
    """``metric`` of the run at the largest step it logged it at or before ``step``: (that step,
    rank 0's value, or the mean of every rank's with ``ranks = "mean"``); None when it has none
    (or rank 0 logged none at that step). NaN stays NaN."""
    found = metricstore.at_or_before(session, run_id, metric, step)
    if found is None:
        return None
    at, by_rank = found
    if ranks == "mean":
        values = list(by_rank.values())
        return at, math.fsum(values) / len(values)
    return (at, by_rank[0]) if 0 in by_rank else None


def newest_logged(session: Session, run_id: int, metric: str) -> int | None:
    """The largest step the run logged ``metric`` at (any attempt), or None."""
    found = metricstore.at_or_before(session, run_id, metric, math.inf)
    return found[0] if found is not None else None


def checkpoint_at_or_past(session: Session, run_id: int, step: int) -> int | None:
    """The step of the run's first verified checkpoint at or past ``step`` (kept or since deleted by
    retention: it was verified there), not one refused as not the run's own; None before it has one."""
    found: int | None = session.scalar(
        select(func.min(Checkpoint.step)).where(Checkpoint.run_id == run_id, Checkpoint.step >= step,
                                                Checkpoint.verified.is_(True), Checkpoint.refused_reason.is_(None)))
    return found


def newest_checkpoints(session: Session, run_ids: Sequence[int]) -> dict[int, int]:
    """Per run, the step of its newest verified checkpoint of its own (runs without one left out):
    one statement for a whole sweep, so a pass reads the rungs only of the trials that passed one."""
    if not run_ids:
        return {}
    rows = session.execute(
        select(Checkpoint.run_id, func.max(Checkpoint.step))
        .where(Checkpoint.run_id.in_(list(run_ids)), Checkpoint.verified.is_(True),
               Checkpoint.refused_reason.is_(None))
        .group_by(Checkpoint.run_id))
    return {run_id: step for run_id, step in rows}
