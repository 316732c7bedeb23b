"""Read queries for the Compare page: several runs side by side.

- :func:`metric_summaries`: the final and the best value of some metrics of some runs, where a
  metric's value at a step is the mean over the ranks that logged it there (what the charts
  draw), along each run's lineage (steps an attempt logged after a later attempt's resume step
  were abandoned and do not count). Two statements however many runs and metrics.
- :func:`compare_runs`: the runs' summaries (status, steps, wall time, cost: the Runs page's
  batched read) and their configs, in a fixed number of statements.
- :func:`config_diff`: the config keys, flattened as ``section.key``, whose values differ.

Which way is best: :func:`higher_is_better` (max for accuracy-like keys, min for the rest).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, case, func, literal, or_, select
from sqlalchemy.orm import Session, aliased

from db import queries
from db.models import Attempt, MetricName, MetricPoint, Run

# Metric names (or their last ``/``- or ``.``-separated part) that are better when higher: the
# words below as a whole word of the name (``eval_accuracy``, ``top1``, ``val/f1``,
# ``tokens_per_s``). Every other metric (loss, perplexity, error, time, memory) is best at its
# minimum.
HIGHER_WORDS = ("acc", "accuracy", "top1", "top5", "f1", "precision", "recall", "auc", "bleu", "rouge", "iou",
                "dice", "map", "score", "reward", "return", "mfu", "throughput", "tflops")
HIGHER_SUFFIXES = ("_per_s", "_per_sec", "_per_second", "/s")
_WORD = re.compile(r"[a-z0-9]+")
# Config keys not diffed: the name is every run's own (it labels the run's column already).
NOT_DIFFED = frozenset({"name"})
ABSENT = "—"  # a key one run's config does not have


class CompareError(ValueError):
    """A Compare read was asked something it cannot answer (the message says what to change)."""


def higher_is_better(key: str) -> bool:
    """Whether a metric is best at its maximum: accuracy-like words (``HIGHER_WORDS``) as a
    whole word of its name, or a rate (``HIGHER_SUFFIXES``); loss-like otherwise."""
    name = key.lower()
    if name.endswith(HIGHER_SUFFIXES):
        return True
    last = re.split(r"[/.]", name)[-1]
    return any(word in HIGHER_WORDS for word in _WORD.findall(last))


@dataclass(frozen=True)
class MetricSummary:
    """One metric of one run along its lineage (values are the mean over ranks at a step).

    Attributes:
        final: The value at the last step (NaN when every rank logged NaN there).
        final_step: That step.
        best: The minimum, or the maximum for :func:`higher_is_better` keys, over the steps
            whose value is not NaN; None when every one is NaN.
        best_step: The step of ``best`` (the earliest one when several tie).
        steps: How many steps logged the metric.
        higher_is_better: Which way ``best`` was chosen.
    """

    final: float
    final_step: int
    best: float | None
    best_step: int | None
    steps: int
    higher_is_better: bool


def _lineage_steps(run_ids: Sequence[int], name_ids: Sequence[int]) -> Select:
    """Per (run, name, attempt, step) on the run's lineage, the mean over ranks: the points are
    read in their primary key's order (run, name, attempt, step, rank), so the grouping is one
    pass over each series. A step is on the lineage unless a later attempt resumed from an
    earlier step (db.queries.lineage_cutoffs, here in SQL)."""
    P = MetricPoint
    later = aliased(Attempt)
    cutoff = (select(func.min(func.coalesce(later.resume_step, 0)))
              .where(later.run_id == Attempt.run_id, later.number > Attempt.number).scalar_subquery())
    cutoffs = (select(Attempt.run_id, Attempt.number, cutoff.label("cutoff"))
               .where(Attempt.run_id.in_(run_ids)).subquery())
    per_step = (
        select(P.run_id, P.name_id, P.attempt, P.step, func.avg(P.value).label("value"),
               func.count(P.value).label("finite"))
        .where(P.run_id.in_(run_ids), P.name_id.in_(name_ids))
        .group_by(P.run_id, P.name_id, P.attempt, P.step)
        .subquery()
    )
    return (
        select(per_step)
        .select_from(per_step.outerjoin(
            cutoffs, and_(cutoffs.c.run_id == per_step.c.run_id, cutoffs.c.number == per_step.c.attempt)))
        .where(or_(cutoffs.c.cutoff.is_(None), per_step.c.step <= cutoffs.c.cutoff))
    )


def metric_summaries(session: Session, run_ids: Sequence[int],
                     keys: Sequence[str]) -> dict[tuple[int, str], MetricSummary]:
    """The final and best value of each metric of each run, in two statements (the names' ids,
    then one read that ranks each series' steps twice, newest first and best first, and keeps
    the first of each).

    Args:
        session: Where to read.
        run_ids: The runs.
        keys: The metric names.

    Returns:
        ``{(run id, key): MetricSummary}``; a run that never logged a key has no entry.
    """
    if not run_ids or not keys:
        return {}
    names = dict(session.execute(select(MetricName.id, MetricName.name).where(MetricName.name.in_(keys))).all())
    if not names:
        return {}
    higher = sorted(i for i, n in names.items() if higher_is_better(n))
    steps = _lineage_steps(sorted(set(run_ids)), sorted(names)).subquery()
    series = (steps.c.run_id, steps.c.name_id)
    # Best first: finite means before NaN ones (NULL), then the value (negated where higher is
    # better), then the earliest step.
    signed = case((steps.c.name_id.in_(higher or [-1]), -steps.c.value), else_=steps.c.value)
    ranked = select(
        *series, steps.c.attempt, steps.c.step, steps.c.value,
        func.row_number().over(partition_by=series, order_by=(steps.c.attempt.desc(), steps.c.step.desc()))
        .label("newest"),
        func.row_number().over(partition_by=series, order_by=(
            case((steps.c.value.is_(None), literal(1)), else_=literal(0)), signed, steps.c.attempt, steps.c.step))
        .label("best"),
        func.count().over(partition_by=series).label("steps"),
    ).subquery()
    rows = session.execute(
        select(ranked).where(or_(ranked.c.newest == 1, ranked.c.best == 1))
    ).all()
    final: dict[tuple[int, str], tuple[float, int, int]] = {}
    best: dict[tuple[int, str], tuple[float | None, int | None]] = {}
    for run_id, name_id, _, step, value, newest, first, count in rows:
        key = (run_id, names[name_id])
        if newest == 1:
            final[key] = (math.nan if value is None else float(value), step, count)
        if first == 1:
            best[key] = (None, None) if value is None else (float(value), step)
    return {
        key: MetricSummary(final=value, final_step=step, best=best[key][0], best_step=best[key][1], steps=count,
                           higher_is_better=higher_is_better(key[1]))
        for key, (value, step, count) in final.items()
    }


def compare_runs(session: Session, run_ids: Sequence[int], now: float | None = None) -> list[dict[str, Any]]:
    """What the Compare page shows of each run beside its metrics: the Runs page's summary
    (``status``, ``step``, ``elapsed_s``, ``cost_usd``...) and ``config`` (a dict), in the order
    of ``run_ids``. A fixed number of statements however many runs.

    Raises:
        CompareError: when an id is no run (the message names it).
    """
    rows = {r.id: r for r in session.execute(
        select(*queries.RUN_COLUMNS, Run.config_json).where(Run.id.in_(run_ids))).all()}
    missing = [i for i in run_ids if i not in rows]
    if missing:
        raise CompareError(f"runs={','.join(map(str, run_ids))}: no run with id {missing[0]}; "
                           "pick the runs on the Runs page or `runyard ls`")
    ordered = [rows[i] for i in run_ids]
    summaries = queries.run_summaries(session, ordered, time.time() if now is None else now)
    for summary, row in zip(summaries, ordered, strict=True):
        summary["config"] = json.loads(row.config_json)
    return summaries


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"section.key": value}``; a value that is not a dict (a list, an
    empty dict) is kept whole."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def config_diff(configs: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Any]]]:
    """The flattened keys whose value is not the same in every config, sorted, each with one
    value per config (``ABSENT`` where that config lacks the key). ``NOT_DIFFED`` keys are left
    out. Fewer than two configs differ in nothing."""
    if len(configs) < 2:
        return []
    flat = [flatten(c) for c in configs]
    keys = sorted({k for f in flat for k in f} - NOT_DIFFED)
    diff = []
    for key in keys:
        values = [f.get(key, ABSENT) for f in flat]
        if any(v != values[0] or (key in f) != (key in flat[0]) for v, f in zip(values, flat, strict=True)):
            diff.append((key, values))
    return diff
