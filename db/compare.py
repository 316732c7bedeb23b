"""Read queries for the Compare page: several runs side by side.

- :func:`metric_summaries`: the final and the best value of some metrics of some runs, where a
  metric's value at a step is the mean over the ranks that logged it there (what the charts
  draw), along each run's lineage (steps an attempt logged after a later attempt's resume step
  were abandoned and do not count), read at the Compare chart's resolution (a long run's
  rollup buckets, never more than ``MAX_POINTS`` rows per rank). Three statements however many
  runs and metrics, and a bounded read however long the runs.
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
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, and_, case, func, literal, or_, select, true, union_all
from sqlalchemy.orm import Session, aliased

from db import run_list, run_summary
from db.metricstore import BASE, LEVELS, choose_level
from db.models import Attempt, MetricName, MetricPoint, MetricRollup, Run
from db.run_list import flatten
from db.vocabulary import metric_registry

if TYPE_CHECKING:
    from typing_extensions import Unpack  # Select[Unpack[tuple[Any, ...]]]: any columns

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
MAX_RUNS = 10  # the most runs the Compare page takes (each with its own colour: app/compare_charts.PALETTE)
# Steps (or rollup buckets) per rank a Runs-list summary reads of a series: coarser than Compare's.
LIST_METRIC_POINTS = 100
MAX_POINTS = 1000  # the most steps per rank a summary reads of a series: the Compare chart's resolution


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
        final: The mean over ranks of each rank's last value (NaN when every one is NaN).
        final_step: The step of that value (the largest on the lineage).
        best: The minimum, or the maximum for :func:`higher_is_better` keys, of the values the
            Compare chart draws (NaN left out): the rank mean at each step, or for a run with
            more than ``max_points`` logged steps the rank mean of each bucket of ``bucket_steps``
            steps; None when every one is NaN.
        best_step: The step of ``best`` (a bucket's first step; the earliest one when several tie).
        best_last_step: ``best_step`` itself, or the bucket's last step.
        points: How many values (steps, or buckets) ``best`` was chosen from.
        bucket_steps: 1 for exact steps, else the bucket size (a power of 4).
        higher_is_better: Which way ``best`` was chosen.
    """

    final: float
    final_step: int
    best: float | None
    best_step: int | None
    best_last_step: int | None
    points: int
    bucket_steps: int
    higher_is_better: bool


def _catalogue(session: Session, run_ids: Sequence[int],
               name_ids: Sequence[int]) -> dict[tuple[int, int], list[tuple[Any, ...]]]:
    """(run, name) -> the metric store's catalogue of its series: (attempt, rank, first step,
    last step, points) from the coarsest rollup level, every run and name in one statement."""
    R = MetricRollup
    rows = session.execute(
        select(R.run_id, R.name_id, R.attempt, R.rank, func.min(R.first_step), func.max(R.last_step),
               func.sum(R.count))
        .where(R.run_id.in_(run_ids), R.name_id.in_(name_ids), R.level == LEVELS)
        .group_by(R.run_id, R.name_id, R.attempt, R.rank)
    ).all()
    catalogue: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
    for run_id, name_id, *entry in rows:
        catalogue.setdefault((run_id, name_id), []).append(tuple(entry))
    return catalogue


def _lineage_steps(levels: Mapping[tuple[int, int], int], run_ids: Sequence[int],
                   until: int | None = None) -> Select[Unpack[tuple[Any, ...]]]:
    """Per (run, name, attempt, step) on the run's lineage: ``value``, the mean over ranks
    (of each rank's value, or of its bucket's mean), ``last`` (the mean of the ranks' values at
    their last step in the bucket), ``last_step`` and ``size`` (the bucket's steps). Series at
    level 0 are read from the raw points, the others from their rollup level: at most about
    ``max_points`` rows per rank either way, one index range each (an OR of equalities, which
    SQLite turns into one index seek per term; a row-value IN scanned the table). A bucket is on the lineage
    unless it starts after a later attempt's resume step (db.run_summary.lineage_cutoffs, in SQL,
    and the rule the charts follow)."""
    P, R = MetricPoint, MetricRollup
    raw = [k for k, level in levels.items() if level == 0]
    rolled = [(*k, level) for k, level in levels.items() if level > 0]
    parts: list[Select[Unpack[tuple[Any, ...]]]] = []
    if raw:
        parts.append(
            select(P.run_id, P.name_id, P.attempt, P.step, func.avg(P.value).label("value"),
                   func.avg(P.value).label("last"), P.step.label("last_step"), literal(1).label("size"))
            .where(or_(*(and_(P.run_id == r, P.name_id == n) for r, n in raw)))
            .group_by(P.run_id, P.name_id, P.attempt, P.step))
    if rolled:
        size = _bucket_size(R.level)
        mean = case((R.count > R.nan_count, R.sum_value / (R.count - R.nan_count)))
        parts.append(
            select(R.run_id, R.name_id, R.attempt, (R.bucket * size).label("step"), func.avg(mean).label("value"),
                   func.avg(R.last_value).label("last"), func.max(R.last_step).label("last_step"),
                   size.label("size"))
            .where(or_(*(and_(R.run_id == r, R.name_id == n, R.level == lv) for r, n, lv in rolled)))
            .group_by(R.run_id, R.name_id, R.level, R.attempt, R.bucket))
    steps = (parts[0] if len(parts) == 1 else union_all(*parts)).subquery()
    later = aliased(Attempt)
    cutoff = (select(func.min(func.coalesce(later.resume_step, 0)))
              .where(later.run_id == Attempt.run_id, later.number > Attempt.number).scalar_subquery())
    cutoffs = (select(Attempt.run_id, Attempt.number, cutoff.label("cutoff"))
               .where(Attempt.run_id.in_(run_ids)).subquery())
    return (
        select(steps)
        .select_from(steps.outerjoin(
            cutoffs, and_(cutoffs.c.run_id == steps.c.run_id, cutoffs.c.number == steps.c.attempt)))
        .where(or_(cutoffs.c.cutoff.is_(None), steps.c.step <= cutoffs.c.cutoff),
               true() if until is None else steps.c.step <= until)
    )


def _bucket_size(level: Any) -> Any:
    """4**level in SQL without a power function (SQLite has none by default): a CASE over the
    store's levels."""
    return case(*((level == n, literal(BASE**n)) for n in range(1, LEVELS + 1)), else_=literal(1))


def metric_summaries(session: Session, run_ids: Sequence[int], keys: Sequence[str],
                     max_points: int = MAX_POINTS, until: int | None = None) -> dict[tuple[int, str], MetricSummary]:
    """The final and best value of each metric of each run, in three statements however many
    runs and metrics: the names' ids, the store's catalogue of their series (which level keeps
    each at most ``max_points`` rows per rank: the level the Compare chart draws), and one read
    at those levels that ranks each series' steps twice, newest first and best first, keeping
    the first of each.

    Args:
        session: Where to read.
        run_ids: The runs.
        keys: The metric names.
        max_points: The most steps (or buckets) per rank read for a series; the charts' value.
        until: Only the steps (or buckets starting) up to this one: a fork's parent up to the
            fork's step (its lineage's first part).

    Returns:
        ``{(run id, key): MetricSummary}``; a run that never logged a key has no entry.
    """
    if not run_ids or not keys:
        return {}
    names = dict(session.execute(select(MetricName.id, MetricName.name).where(MetricName.name.in_(keys))).all())
    if not names:
        return {}
    runs = sorted(set(run_ids))
    levels = {k: choose_level(c, max_points) for k, c in _catalogue(session, runs, sorted(names)).items()}
    if not levels:
        return {}
    higher = sorted(i for i, n in names.items() if higher_is_better(n))
    steps = _lineage_steps(levels, runs, until).subquery()
    series = (steps.c.run_id, steps.c.name_id)
    # Best first: finite means before NaN ones (NULL), then the value (negated where higher is
    # better), then the earliest step.
    signed = case((steps.c.name_id.in_(higher or [-1]), -steps.c.value), else_=steps.c.value)
    ranked = select(
        *series, steps.c.step, steps.c.value, steps.c.last, steps.c.last_step, steps.c.size,
        func.row_number().over(partition_by=series, order_by=(steps.c.attempt.desc(), steps.c.step.desc()))
        .label("newest"),
        func.row_number().over(partition_by=series, order_by=(
            case((steps.c.value.is_(None), literal(1)), else_=literal(0)), signed, steps.c.attempt, steps.c.step))
        .label("best"),
        func.count().over(partition_by=series).label("points"),
    ).subquery()
    rows = session.execute(select(ranked).where(or_(ranked.c.newest == 1, ranked.c.best == 1))).all()
    final: dict[tuple[int, str], tuple[float, int, int, int]] = {}
    best: dict[tuple[int, str], tuple[float | None, int | None, int | None]] = {}
    for run_id, name_id, step, value, last, last_step, size, newest, first, count in rows:
        key = (run_id, names[name_id])
        if newest == 1:
            final[key] = (math.nan if last is None else float(last), last_step, count, size)
        if first == 1:
            best[key] = (None, None, None) if value is None else (float(value), step, last_step)
    return {
        key: MetricSummary(final=value, final_step=step, best=best[key][0], best_step=best[key][1],
                           best_last_step=best[key][2], points=count, bucket_steps=size,
                           higher_is_better=higher_is_better(key[1]))
        for key, (value, step, count, size) in final.items()
    }


def compare_runs(session: Session, run_ids: Sequence[int], now: float | None = None) -> list[dict[str, Any]]:
    """What the Compare page shows of each run beside its metrics: the Runs page's summary
    (``status``, ``step``, ``elapsed_s``, ``cost_usd``...) and ``config`` (a dict), in the order
    of ``run_ids``. A fixed number of statements however many runs.

    Raises:
        CompareError: when an id is no run (the message names it).
    """
    rows = {r.id: r for r in session.execute(
        select(*run_summary.RUN_COLUMNS, Run.config_json).where(Run.id.in_(run_ids))).all()}
    missing = [i for i in run_ids if i not in rows]
    if missing:
        raise CompareError(f"runs={','.join(map(str, run_ids))}: no run with id {missing[0]}; "
                           "pick the runs on the Runs page or `runyard ls`")
    ordered = [rows[i] for i in run_ids]
    summaries = run_summary.run_summaries(session, ordered, time.time() if now is None else now)
    for summary, row in zip(summaries, ordered, strict=True):
        summary["config"] = json.loads(row.config_json)
    return summaries


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


def runs_list(session: Session, where: run_list.RunFilter | None = None, sort: str = "id", descending: bool = True,
              limit: int = 200, now: float | None = None) -> list[dict[str, Any]]:
    """The Runs page's list: :func:`db.run_list.list_runs` with each run's summary metric columns
    (``best_loss``: the best of its loss along its lineage, a fork's parent's part included, and ``headline_key`` /
    ``headline_value``: the final value of the workload's headline metric,
    db.vocabulary.metric_registry.HEADLINE_KEYS), sorted by any of db.run_list.LIST_SORTS. Three statements
    more than ``list_runs`` for all the runs, each series read at ``LIST_METRIC_POINTS`` steps
    (or rollup buckets) per rank at most, so a long run costs no more than a short one.

    The newest ``limit`` runs that match ``where`` are listed, then sorted.
    """
    runs = run_list.list_runs(session, limit=limit, now=now, where=where)
    keys = [*metric_registry.LOSS_KEYS, *metric_registry.HEADLINE_KEYS]
    found = metric_summaries(session, [r["id"] for r in runs], keys, max_points=LIST_METRIC_POINTS)
    inherited = _parents_best_loss(session, runs)
    for r in runs:
        logged = {key for run_id, key in found if run_id == r["id"]}
        loss, headline = metric_registry.loss_key(logged), metric_registry.headline_key(logged)
        final = found[(r["id"], headline)].final if headline else None
        own = found[(r["id"], loss)].best if loss else None
        r["best_loss"] = _lower(own, inherited.get(r["id"]))
        r["headline_key"] = headline
        r["headline_value"] = None if final is None or math.isnan(final) else final
    return run_list.sort_runs(runs, sort, descending)


def _lower(a: float | None, b: float | None) -> float | None:
    """The lower of two best losses, either of which may be missing."""
    return b if a is None else a if b is None else min(a, b)


def _parents_best_loss(session: Session, runs: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Each fork's best loss on the first part of its lineage: its parent's, up to the step it was
    forked at (a fork that has logged nothing yet still has a best loss). Three statements per
    distinct fork step; the parent's own lineage only (a fork of a fork: its parent's part)."""
    forks: dict[int, list[tuple[int, int]]] = {}
    for r in runs:
        if r.get("parent_run_id") is not None and r.get("parent_step") is not None:
            forks.setdefault(r["parent_step"], []).append((r["id"], r["parent_run_id"]))
    best: dict[int, float] = {}
    for step, pairs in forks.items():
        found = metric_summaries(session, sorted({p for _, p in pairs}), metric_registry.LOSS_KEYS,
                                 max_points=LIST_METRIC_POINTS, until=step)
        for fork_id, parent_id in pairs:
            loss = metric_registry.loss_key({key for run_id, key in found if run_id == parent_id})
            if loss and (value := found[(parent_id, loss)].best) is not None:
                best[fork_id] = value
    return best
