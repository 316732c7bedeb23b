"""Reading points from the metric store besides a chart's series: a run's metric names, the newest
value of each, the newest points of one series or of many at once (what an ETA projects from), the
sum and count of a series, and every raw point for an export."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import CompoundSelect, Integer, Select, and_, bindparam, func, select, union_all
from sqlalchemy.orm import Session

from db.metricstore.rollups import BASE, LEVELS
from db.metricstore.series import NAN, _name_id
from db.models import MetricName, MetricPoint, MetricRollup

if TYPE_CHECKING:
    from typing_extensions import Unpack  # CompoundSelect[Unpack[tuple[Any, ...]]]: any columns

# The metric whose steps pace a run (its ETA) when it has one; else its busiest metric (progress_key).
PROGRESS_KEY = "loss"
_UNION_CACHE = "runyard.recent_union"  # recent_many's statements, by number of parts
# The most SELECTs recent_many joins into one UNION ALL: SQLite refuses more than 500 in one
# compound statement (SQLITE_MAX_COMPOUND_SELECT), and 256 parts of 3 parameters each (and two
# shared) stay far below its 32,766 host parameters. A power of two: see _recent_union.
_UNION_PARTS = 256


def _nan(value: float | None) -> float:
    return NAN if value is None else value


def metric_keys(session: Session, run_id: int) -> list[str]:
    """The names of the metrics a run reported, sorted."""
    R, N = MetricRollup, MetricName
    has_points = select(R.run_id).where(R.run_id == run_id, R.name_id == N.id).exists()
    return list(session.scalars(select(N.name).where(has_points).order_by(N.name)))


def latest(session: Session, run_id: int, cutoffs: dict[int, float] | None = None) -> dict[str, dict[str, float]]:
    """The newest value of each metric on each rank (the newest attempt's largest step) along the
    run's lineage: ``{"loss": {"0": 0.41, "1": 0.43}}``, keys and ranks sorted.

    Args:
        session: Where to read.
        run_id: The run.
        cutoffs: Per attempt, the last step still on the run's lineage (db.run_summary.lineage_cutoffs):
            what an attempt logged after a later attempt's resume step was abandoned and is never
            the newest value (an eval from step 9000 of an attempt resumed from 5000). A coarse
            bucket that spans a cutoff is read from the raw points up to it.
    """
    R, N = MetricRollup, MetricName
    names = dict(session.execute(
        select(N.id, N.name).where(select(R.run_id).where(R.run_id == run_id, R.name_id == N.id).exists())
    ).all())
    if not names:
        return {}
    cutoffs = cutoffs or {}
    newest: dict[tuple[int, int], tuple[int, int, float | None]] = {}
    spanning: dict[int, set[int]] = {}  # attempt -> names with a bucket across the attempt's cutoff
    for name_id, attempt, rank, first_step, last_step, last in session.execute(
        select(R.name_id, R.attempt, R.rank, R.first_step, R.last_step, R.last_value)
        .where(R.run_id == run_id, R.name_id.in_(sorted(names)), R.level == LEVELS)
    ):
        cut = cutoffs.get(attempt, math.inf)
        if last_step > cut:
            if first_step <= cut:
                spanning.setdefault(attempt, set()).add(name_id)
            continue
        seen = newest.get((name_id, rank))
        if seen is None or (attempt, last_step) > seen[:2]:
            newest[(name_id, rank)] = (attempt, last_step, last)
    for attempt, name_ids in spanning.items():
        for name_id, rank, step, value in _newest_points(session, run_id, attempt, name_ids, int(cutoffs[attempt])):
            seen = newest.get((name_id, rank))
            if seen is None or (attempt, step) > seen[:2]:
                newest[(name_id, rank)] = (attempt, step, value)
    out: dict[str, dict[str, float]] = {}
    for (name_id, rank), (_, _, last) in sorted(newest.items(), key=lambda kv: (names[kv[0][0]], kv[0][1])):
        out.setdefault(names[name_id], {})[str(rank)] = _nan(last)
    return out


def _newest_points(session: Session, run_id: int, attempt: int, name_ids: set[int],
                   max_step: int) -> Sequence[tuple[int, int, int, float | None]]:
    """Per (name, rank) of one attempt, its newest raw point at or before ``max_step``:
    (name id, rank, step, value)."""
    P = MetricPoint
    scope = (P.run_id == run_id, P.attempt == attempt, P.name_id.in_(sorted(name_ids)))
    last = (select(P.name_id, P.rank, func.max(P.step).label("step")).where(*scope, P.step <= max_step)
            .group_by(P.name_id, P.rank).subquery())
    rows = session.execute(
        select(P.name_id, P.rank, P.step, P.value)
        .join(last, and_(last.c.name_id == P.name_id, last.c.rank == P.rank, last.c.step == P.step))
        .where(*scope))
    return [(name_id, rank, step, value) for name_id, rank, step, value in rows]


def at_or_before(session: Session, run_id: int, key: str, step: float) -> tuple[int, dict[int, float]] | None:
    """The values of ``key`` at the largest step at or before ``step`` that the run logged it at,
    by rank: ``(that step, {rank: value})``, from the newest attempt that logged that step (a retry
    that trained it again, after an older attempt's superseded one); None when it logged none.
    A sweep's objective at a rung and at a trial's end (orchestrator/sweeps/objective.py)."""
    name_id = _name_id(session, key)
    if name_id is None:
        return None
    P = MetricPoint
    scope = (P.run_id == run_id, P.name_id == name_id)
    found = session.execute(select(P.attempt, P.step).where(*scope, P.step <= step)
                            .order_by(P.step.desc(), P.attempt.desc()).limit(1)).first()
    if found is None:
        return None
    attempt, at = found
    rows = session.execute(select(P.rank, P.value).where(*scope, P.attempt == attempt, P.step == at))
    return at, {rank: _nan(value) for rank, value in rows}


def recent(session: Session, run_id: int, key: str, *, attempt: int, rank: int,
           limit: int) -> list[tuple[int, float, float]]:
    """The newest ``limit`` points of one series, newest first: (step, value, wall time)."""
    name_id = _name_id(session, key)
    if name_id is None:
        return []
    P = MetricPoint
    rows = session.execute(
        select(P.step, P.value, P.wall_time)
        .where(P.run_id == run_id, P.name_id == name_id, P.attempt == attempt, P.rank == rank)
        .order_by(P.step.desc())
        .limit(limit)
    ).all()
    return [(step, _nan(value), wall) for step, value, wall in rows]


def recent_many(session: Session, key: str, series_keys: Sequence[tuple[int, int, int]], *,
                limit: int) -> dict[tuple[int, int, int], list[tuple[int, float, float]]]:
    """What :func:`recent` gives for each of several series of one metric, in two statements
    however many there are: the name's id, then one ``UNION ALL`` of the series' own
    ``ORDER BY step DESC LIMIT`` reads (each still one index seek, as in :func:`recent`; a
    window function over the runs would scan every point of each series instead).

    Args:
        session: Where to read.
        key: The metric name.
        series_keys: (run id, attempt, rank) of each series.
        limit: The most points per series.

    Returns:
        ``{(run id, attempt, rank): [(step, value, wall time), ...]}``, newest first, for every
        key in ``series_keys`` (an empty list for a series without points).
    """
    out: dict[tuple[int, int, int], list[tuple[int, float, float]]] = {k: [] for k in series_keys}
    name_id = _name_id(session, key) if out else None
    if name_id is None:
        return out
    wanted = sorted(out)
    for start in range(0, len(wanted), _UNION_PARTS):
        chunk = wanted[start:start + _UNION_PARTS]
        # Padded to a power of two with a series that does not exist (run 0: ids start at 1), so
        # that a changing number of live runs reuses a few statements instead of compiling a new
        # one each time (see _recent_union for what that costs).
        parts = min(_UNION_PARTS, 1 << (len(chunk) - 1).bit_length())
        params: dict[str, int] = {"name_id": name_id, "limit": limit}
        for i, (run_id, attempt, rank) in enumerate(chunk + [(0, 0, 0)] * (parts - len(chunk))):
            params.update({f"run_{i}": run_id, f"attempt_{i}": attempt, f"rank_{i}": rank})
        for run_id, attempt, rank, step, value, wall in session.execute(_recent_union(session, parts), params):
            if (points := out.get((run_id, attempt, rank))) is not None:
                points.append((step, _nan(value), wall))
    for points in out.values():
        points.sort(key=lambda p: p[0], reverse=True)  # a UNION keeps no order of its parts' rows
    return out


def progress_key(session: Session, run_id: int, attempt: int, rank: int = 0) -> str | None:
    """The metric whose steps show one series' progress (see :func:`progress_keys`)."""
    return progress_keys(session, [(run_id, attempt, rank)])[(run_id, attempt, rank)]


def progress_keys(session: Session, series_keys: Sequence[tuple[int, int, int]]
                  ) -> dict[tuple[int, int, int], str | None]:
    """For each (run, attempt, rank), the metric whose steps show its progress: ``loss`` when it
    has points there, else the metric that reached the largest step (then the one with the most
    points, then the first name): a script's ``train/loss``, ``train_loss`` or ``batch_size``,
    whatever it is called; None without points. One statement over the coarsest rollups (a few
    rows per series and metric), an index seek per metric name."""
    out: dict[tuple[int, int, int], str | None] = {k: None for k in series_keys}
    if not out:
        return out
    R, N = MetricRollup, MetricName
    # name_id IN (every name) lets SQLite seek the primary key (run, name, level, attempt) per name
    # instead of reading every level of a run's rollups.
    grouped = (
        select(R.run_id, R.attempt, R.rank, R.name_id, func.max(R.last_step).label("last"),
               func.sum(R.count).label("count"))
        .where(R.run_id.in_(sorted({k[0] for k in out})), R.name_id.in_(select(N.id)), R.level == LEVELS,
               R.attempt.in_(sorted({k[1] for k in out})), R.rank.in_(sorted({k[2] for k in out})))
        .group_by(R.run_id, R.attempt, R.rank, R.name_id)
    ).subquery()
    rows = session.execute(
        select(grouped.c.run_id, grouped.c.attempt, grouped.c.rank, N.name, grouped.c.last, grouped.c.count)
        .join(N, N.id == grouped.c.name_id)
    ).all()
    found: dict[tuple[int, int, int], list[tuple[str, int, int]]] = {}
    for run_id, attempt, rank, name, last, count in rows:
        if (run_id, attempt, rank) in out:
            found.setdefault((run_id, attempt, rank), []).append((name, int(last), int(count or 0)))
    for key, metrics in found.items():
        names = {name for name, _, _ in metrics}
        out[key] = PROGRESS_KEY if PROGRESS_KEY in names else min(metrics, key=lambda m: (-m[1], -m[2], m[0]))[0]
    return out


def recent_progress(session: Session, series_keys: Sequence[tuple[int, int, int]], *,
                    limit: int) -> dict[tuple[int, int, int], list[tuple[int, float, float]]]:
    """What :func:`recent_many` gives, of each series' :func:`progress_keys` metric (``loss``
    for all that have it, in one read; the others' metric found in one more): the points an ETA
    projects from, whatever a script calls its metrics."""
    out = recent_many(session, PROGRESS_KEY, series_keys, limit=limit)
    missing = [k for k, points in out.items() if not points]
    others: dict[str, list[tuple[int, int, int]]] = {}
    for key, name in (progress_keys(session, missing).items() if missing else ()):
        if name is not None and name != PROGRESS_KEY:
            others.setdefault(name, []).append(key)
    for name, keys in others.items():
        out.update(recent_many(session, name, keys, limit=limit))
    return out


def _recent_union(session: Session, parts: int) -> CompoundSelect[Unpack[tuple[Any, ...]]]:
    """The ``UNION ALL`` of ``parts`` newest-points reads, with bound parameters ``name_id``,
    ``limit`` and ``run_i``, ``attempt_i``, ``rank_i`` for each part. Built once per size and
    DBAPI connection (SQLAlchemy then compiles it once per engine): building and compiling cost
    far more than running it (measured here for 64 parts: 7 ms to build, about 100 ms to
    compile, 0.7 ms to run once compiled)."""
    cache: dict[int, CompoundSelect[Unpack[tuple[Any, ...]]]] = session.connection().info.setdefault(_UNION_CACHE, {})
    if parts not in cache:
        P = MetricPoint
        cache[parts] = union_all(*(
            select(P.run_id, P.attempt, P.rank, P.step, P.value, P.wall_time)
            .where(P.run_id == bindparam(f"run_{i}"), P.name_id == bindparam("name_id"),
                   P.attempt == bindparam(f"attempt_{i}"), P.rank == bindparam(f"rank_{i}"))
            .order_by(P.step.desc()).limit(bindparam("limit", type_=Integer)).subquery().select()
            for i in range(parts)
        ))
    return cache[parts]


def _covering(hi: int) -> tuple[list[tuple[int, int | None, int]], int]:
    """The fewest rollup buckets that hold the steps 0..``hi`` and nothing after: per level,
    coarsest first, (level, first bucket or None for the level's first, end bucket, excluded),
    and the first step they leave to the raw points (read up to ``hi``)."""
    ranges: list[tuple[int, int | None, int]] = []
    covered = 0
    for level in range(LEVELS, 0, -1):
        size = BASE**level
        end = (hi + 1) // size  # buckets before `end` hold only steps <= hi
        if not ranges or end * size > covered:
            ranges.append((level, covered // size if ranges else None, end))
            covered = end * size
    return ranges, covered


def nan_count(session: Session, run_id: int, cutoffs: dict[int, float] | None = None) -> int:
    """How many NaN points the run logged, every metric and rank, along its lineage: what an
    attempt logged after its cutoff (db.run_summary.lineage_cutoffs: a later attempt's resume
    step) is left out. One statement: the coarsest rollups of the attempts without a cutoff, and
    for each attempt with one, the fewest buckets up to it and the raw points after them (about
    a dozen index ranges an attempt, whatever the run's length and number of metrics)."""
    R, P, N = MetricRollup, MetricPoint, MetricName
    cut = {attempt: int(c) for attempt, c in (cutoffs or {}).items() if not math.isinf(c)}
    # name_id IN (every name): SQLite seeks the primary key (run, name, level, ...) per name.
    rollups = (R.run_id == run_id, R.name_id.in_(select(N.id)))
    parts: list[Select[int]] = [select(func.sum(R.nan_count).label("nans")).where(
        *rollups, R.level == LEVELS, R.attempt.not_in(sorted(cut)))]
    for attempt, hi in sorted(cut.items()):
        ranges, raw_from = _covering(hi)
        for level, first, end in ranges:
            part = select(func.sum(R.nan_count)).where(*rollups, R.level == level, R.attempt == attempt,
                                                       R.bucket < end)
            parts.append(part if first is None else part.where(R.bucket >= first))
        parts.append(select(func.count()).where(P.run_id == run_id, P.name_id.in_(select(N.id)), P.attempt == attempt,
                                                P.step >= raw_from, P.step <= hi, P.value.is_(None)))
    total = 0
    for start in range(0, len(parts), _UNION_PARTS):  # SQLite's limit on a compound statement
        both = union_all(*parts[start:start + _UNION_PARTS]).subquery()
        total += int(session.scalar(select(func.sum(both.c.nans))) or 0)
    return total


def totals(session: Session, run_id: int, key: str, *, attempt: int, rank: int,
           max_step: float | None = None) -> tuple[float, int]:
    """Sum and count of the non-NaN values of one series up to ``max_step`` (all steps when
    None), from the fewest rollup buckets that cover the range: a few dozen rows for any run."""
    name_id = _name_id(session, key)
    if name_id is None:
        return 0.0, 0
    R, P = MetricRollup, MetricPoint
    series_of = (R.run_id == run_id, R.name_id == name_id, R.attempt == attempt, R.rank == rank)
    ranges: Sequence[tuple[int, int | None, int | None]] = [(LEVELS, None, None)]
    raw_from, hi = None, None
    if max_step is not None and not math.isinf(max_step):
        hi = int(max_step)
        ranges, raw_from = _covering(hi)
    total, count = 0.0, 0
    for level, first, end in ranges:  # one index range per level: a few rows each
        q = select(R.sum_value, R.count, R.nan_count).where(*series_of, R.level == level)
        if first is not None:
            q = q.where(R.bucket >= first)
        if end is not None:
            q = q.where(R.bucket < end)
        for s, n, nans in session.execute(q):
            total += _nan(s)
            count += n - nans
    if hi is not None:
        for (value,) in session.execute(
            select(P.value).where(P.run_id == run_id, P.name_id == name_id, P.attempt == attempt, P.rank == rank,
                                  P.step >= raw_from, P.step <= hi)
        ):
            if value is not None:
                total += value
                count += 1
    return total, count


def iter_rows(session: Session, run_id: int, batch: int = 10_000) -> Iterator[tuple[int, int, int, str, float, float]]:
    """Every raw point of a run in (attempt, step, rank, key) order, streamed in batches:
    (attempt, rank, step, key, value, wall time), NaN as ``float("nan")``."""
    P, N = MetricPoint, MetricName
    result = session.execute(
        select(P.attempt, P.rank, P.step, N.name, P.value, P.wall_time)
        .join(N, N.id == P.name_id)
        .where(P.run_id == run_id)
        .order_by(P.attempt, P.step, P.rank, N.name)
        .execution_options(yield_per=batch)
    )
    for attempt, rank, step, key, value, wall in result:
        yield attempt, rank, step, key, _nan(value), wall
