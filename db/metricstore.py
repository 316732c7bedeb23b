"""The metric store: every rank's metric points, and rollups that keep a chart of a long run cheap.

Rank 0's writer calls :func:`write_points` with each batch; the charts call :func:`series`,
which reads either the raw points or one rollup level, always as one index range scan, so a
chart of a 10M-point run reads about as many rows as one of a 100k-point run.

Both big tables are clustered on their primary key on SQLite (WITHOUT ROWID), with the rank
last: a chart reads one contiguous range, and a batch of a live run appends to one place per
metric and level instead of one per (metric, rank, level), which is what write throughput
comes down to.

Tables (db/models.py):

- ``metric_names``: each metric name once; the other tables hold its id.
- ``metric_points``: the raw points, keyed by (run, name, attempt, step, rank). A point is
  written once: when the same (run, key, attempt, step, rank) arrives again, in the same batch
  or a later one, the first value is kept and the later one dropped, so that the rollups always
  equal what the stored points give.
- ``metric_rollups``: for each level 1..``LEVELS``, the points of one (run, name, attempt, rank)
  in buckets of ``4**level`` steps (``bucket = step // 4**level``): min, max, sum, count,
  nan_count, first and last step, the wall time at each, and the value at the last step. Every
  batch updates every level (level 1 from the batch's points, each higher level from the level
  below, then one upsert that merges them into the stored buckets: db/metricrollups.py), so
  points that arrive out of order or over several batches give exactly the rollups one batch
  would (the sum up to floating-point rounding).

NaN and infinities (the rule every reader here follows):

- SQLite cannot store a NaN (it turns one into NULL), so a NULL value *is* NaN, on every
  database: a raw ``value``, a rollup's ``last_value``. Readers return ``float("nan")`` for it,
  never None. +Inf and -Inf are stored as real infinities.
- A rollup's min, max and sum (hence mean) are over the non-NaN values: min and max are NULL
  (read as NaN) when every value in the bucket is NaN, and the mean is then NaN. ``count``
  counts every point, ``nan_count`` the NaN ones. A sum that meets both +Inf and -Inf is NaN
  (stored as NULL), so that bucket's mean is NaN, as Python's arithmetic would say.
- ``last`` is the value at the bucket's largest step and may be NaN.

Steps are expected to be >= 0 (buckets use floor division).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    CompoundSelect,
    Connection,
    Insert,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    event,
    func,
    insert,
    select,
    union_all,
)
from sqlalchemy.orm import Session

from db.metricrollups import (
    BASE,
    LEVELS,
    ROLLUP_COLUMNS,
    MetricStoreError,
    Point,
    dialect_insert,
    rollup_upsert,
    summarize,
)
from db.models import MetricName, MetricPoint, MetricRollup

if TYPE_CHECKING:
    from typing_extensions import Unpack  # Select[Unpack[tuple[Any, ...]]]: any columns

__all__ = ["BASE", "LEVELS", "MetricStoreError", "Series", "choose_level", "iter_rows", "latest", "metric_keys",
           "progress_key", "progress_keys", "recent", "recent_many", "recent_progress", "series", "totals",
           "write_points"]

# The metric whose steps pace a run (its ETA) when it has one; else its busiest metric (progress_key).
PROGRESS_KEY = "loss"

# Where write_points keeps name -> id, and its compiled SQL, on the DBAPI connection
# (Connection.info), so that they live as long as the connection and no longer.
_NAME_CACHE = "runyard.metric_name_ids"
_SQL_CACHE = "runyard.metric_sql"
_UNION_CACHE = "runyard.recent_union"  # recent_many's statements, by number of parts
_POINT_COLUMNS = ("run_id", "name_id", "attempt", "step", "rank", "value", "wall_time")

NAN = float("nan")
# The most SELECTs recent_many joins into one UNION ALL: SQLite refuses more than 500 in one
# compound statement (SQLITE_MAX_COMPOUND_SELECT), and 256 parts of 3 parameters each (and two
# shared) stay far below its 32,766 host parameters. A power of two: see _recent_union.
_UNION_PARTS = 256


@dataclass
class Series:
    """One metric of one run, on every (attempt, rank), at one resolution.

    Attributes:
        level: 0 for raw points, ``l`` for buckets of ``4**l`` steps.
        bucket_steps: ``4**level``.
        rows: Sorted by attempt, rank, step; keys ``attempt``, ``rank``, ``step`` (the step, or
            the bucket's first step), ``last_step`` (the largest step present), ``value`` (the
            value, or the mean of the non-NaN values), ``min``, ``max``, ``last`` (the value at
            ``last_step``), ``count``, ``nan_count``, ``wall_time`` (the time of the point at
            ``last_step``). NaN is ``float("nan")``.
        max_step: The largest step of the metric in the run (every attempt and rank), or None
            when it has no points.
    """

    level: int
    bucket_steps: int
    rows: list[dict[str, Any]]
    max_step: int | None


def _nan(value: float | None) -> float:
    return NAN if value is None else value


# -- writing -------------------------------------------------------------------------------------


def write_points(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Store a batch of points and bring every rollup level up to date, in the caller's
    transaction.

    Args:
        conn: The connection (and transaction) to write in.
        rows: Dicts with ``run_id``, ``attempt``, ``rank``, ``step``, ``key``, ``value`` (a float;
            NaN, +Inf and -Inf allowed; None is taken as NaN) and ``wall_time``. A point already
            stored, or repeated in ``rows``, keeps its first value.
    """
    if not rows:
        return
    keys = [r["key"] for r in rows]
    ids = _name_ids(conn, set(keys))
    columns = (
        [r["run_id"] for r in rows], [ids[k] for k in keys], [r["attempt"] for r in rows], [r["step"] for r in rows],
        [r["rank"] for r in rows], [None if (v := r["value"]) is None or v != v else float(v) for r in rows],
        [r["wall_time"] for r in rows],
    )
    points: list[Point] = list(zip(*columns, strict=True))
    batch = summarize(*columns)
    postgres = conn.dialect.name == "postgresql"
    if postgres:  # PostgreSQL's write path, binary COPY (imported here: ~45 ms that SQLite need not pay)
        from db.metricbulk import check_ranges, hold_and_find_stored, write_batch  # noqa: PLC0415 - PostgreSQL only (see above)

        check_ranges(batch)  # before the first statement that binds a key
    if batch.repeated:  # a point repeated within the batch: keep its first value
        first: dict[tuple[Any, ...], Point] = {}
        for p in points:
            first.setdefault(p[:5], p)
        points = list(first.values())
        batch = summarize(*zip(*points, strict=True))
    if postgres:
        stored = hold_and_find_stored(conn, batch.step_ranges, set(ids.values()))
    else:
        stored = _already_stored(conn, batch.step_ranges, set(ids.values()))
    if stored:
        points = [p for p in points if p[:5] not in stored]
        if not points:
            return
        batch = summarize(*zip(*points, strict=True))
    if postgres:
        write_batch(conn, points, batch)  # binary COPY and a merge
        return
    _executemany(conn, "points", _points_insert, _POINT_COLUMNS, points)
    _executemany(conn, "rollups", rollup_upsert, ROLLUP_COLUMNS, batch.rows)


def _executemany(conn: Connection, name: str, build: Callable[[str], Any], columns: tuple[str, ...],
                 rows: list[tuple[Any, ...]]) -> None:
    """Run statement ``build(dialect)`` once per row of ``rows`` (tuples in ``columns`` order)
    straight through the DBAPI's executemany: SQLAlchemy's per-row parameter processing would
    otherwise cost more than SQLite's own work. The compiled SQL is cached on the DBAPI
    connection."""
    cache: dict[str, tuple[str, list[int] | None]] = conn.info.setdefault(_SQL_CACHE, {})
    if name not in cache:
        compiled = build(conn.dialect.name).compile(dialect=conn.dialect)
        order = [columns.index(n) for n in compiled.positiontup] if compiled.positional else None
        cache[name] = (str(compiled), order)
    sql, order = cache[name]
    if order is None:
        params: list[Any] = [dict(zip(columns, r, strict=True)) for r in rows]
    elif order == list(range(len(columns))):
        params = rows
    else:
        params = [tuple(r[i] for i in order) for r in rows]
    conn.exec_driver_sql(sql, params)


def _name_ids(conn: Connection, names: set[str]) -> dict[str, int]:
    """The id of each name, creating missing ones. Ids are cached on the DBAPI connection; a
    rollback of a transaction that created names empties the cache."""
    cache: dict[str, int] = conn.info.setdefault(_NAME_CACHE, {})
    missing = [n for n in names if n not in cache]
    if missing:
        found = _select_names(conn, missing)
        new = [n for n in missing if n not in found]
        if new:
            # ON CONFLICT DO NOTHING: another writer may create the same name at the same time.
            conn.execute(dialect_insert(conn.dialect.name)(MetricName).on_conflict_do_nothing(),
                         [{"name": n} for n in sorted(new)])
            found.update(_select_names(conn, new))
            # Ids created in this transaction vanish if it rolls back: forget the cache then.
            event.listen(conn, "rollback", _forget_names, once=True)
        cache.update(found)
    return {n: cache[n] for n in names}


def _select_names(conn: Connection, names: list[str]) -> dict[str, int]:
    return dict(conn.execute(select(MetricName.name, MetricName.id).where(MetricName.name.in_(names))).all())


def _forget_names(conn: Connection) -> None:
    conn.info.pop(_NAME_CACHE, None)


# The stored points of some names of one (run, attempt) in a step range: one index seek per name.
_STORED_IN_RANGE = select(MetricPoint.run_id, MetricPoint.name_id, MetricPoint.attempt, MetricPoint.step,
                          MetricPoint.rank).where(
    MetricPoint.run_id == bindparam("run_id"), MetricPoint.name_id.in_(bindparam("name_ids", expanding=True)),
    MetricPoint.attempt == bindparam("attempt"), MetricPoint.step.between(bindparam("lo"), bindparam("hi")),
)


def _already_stored(conn: Connection, step_ranges: dict[tuple[int, int], tuple[int, int]],
                    name_ids: set[int]) -> set[tuple[Any, ...]]:
    """Keys (run, name id, attempt, step, rank) of stored points inside the batch's step range
    of each (run, attempt), which finds nothing for a live run's newest steps."""
    stored: set[tuple[Any, ...]] = set()
    for (run_id, attempt), (lo, hi) in step_ranges.items():
        found = conn.execute(_STORED_IN_RANGE, {"run_id": run_id, "name_ids": sorted(name_ids), "attempt": attempt,
                                                "lo": lo, "hi": hi}).all()
        stored.update(map(tuple, found))
    return stored


def _points_insert(dialect: str) -> Insert:
    return insert(MetricPoint)


# -- reading -------------------------------------------------------------------------------------


def _name_id(session: Session, key: str) -> int | None:
    return session.scalar(select(MetricName.id).where(MetricName.name == key))


def _catalogue(session: Session, run_id: int, name_id: int) -> list[tuple[int, int, int, int, int]]:
    """(attempt, rank, first step, last step, point count) of each series, from the coarsest
    level (a few rows per series)."""
    R = MetricRollup
    rows = session.execute(
        select(R.attempt, R.rank, func.min(R.first_step), func.max(R.last_step), func.sum(R.count))
        .where(R.run_id == run_id, R.name_id == name_id, R.level == LEVELS)
        .group_by(R.attempt, R.rank)
        .order_by(R.attempt, R.rank)
    ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def choose_level(catalogue: list[tuple[int, int, int, int, int]], max_points: int) -> int:
    """The finest level at which no series has more than ``max_points`` buckets.

    Args:
        catalogue: One (attempt, rank, first step, last step, point count) per series. A series
            has ``count`` raw points and at most ``min(count, last // 4**l - first // 4**l + 1)``
            buckets at level ``l``.
        max_points: The most rows a series may have.

    Returns:
        The level, ``LEVELS`` when even that one has more.
    """
    for level in range(LEVELS + 1):
        size = BASE**level
        if all((count if level == 0 else min(count, last // size - first // size + 1)) <= max_points
               for _, _, first, last, count in catalogue):
            return level
    return LEVELS


def series(session: Session, run_id: int, key: str, *, max_points: int = 2000, level: int | None = None,
           since_step: int | None = None) -> Series:
    """One metric of a run on every attempt and rank, at most ``max_points`` per series.

    Args:
        session: Where to read.
        run_id: The run.
        key: The metric name.
        max_points: With ``level=None``, the finest level whose bucket count per (attempt, rank)
            series over the metric's step range is at most this is used (0, the raw points, for
            a short run).
        level: Read this level instead (0 = raw points, up to ``LEVELS``).
        since_step: Only the buckets that hold a step >= this: a live chart passes the first step
            of its newest (possibly partial) bucket and gets that bucket again and the new ones.

    Returns:
        The :class:`Series`.
    """
    name_id = _name_id(session, key)
    catalogue = _catalogue(session, run_id, name_id) if name_id is not None else []
    if level is None:
        level = choose_level(catalogue, max_points)
    if not 0 <= level <= LEVELS:
        raise MetricStoreError(f"level must be between 0 and {LEVELS}, not {level}")
    size = BASE**level
    if name_id is None or not catalogue:  # no catalogue without a name id
        return Series(level=level, bucket_steps=size, rows=[], max_step=None)
    max_step = max(last for _, _, _, last, _ in catalogue)
    attempts = sorted({a for a, *_ in catalogue})
    if level == 0:
        rows = _raw_rows(session, run_id, name_id, attempts, since_step)
    else:
        rows = _bucket_rows(session, run_id, name_id, level, attempts, since_step)
    return Series(level=level, bucket_steps=size, rows=rows, max_step=max_step)


def _fetch_all(session: Session, stmt: Select[Unpack[tuple[Any, ...]]]) -> Sequence[tuple[Any, ...]]:
    """The rows of a Core SELECT as plain tuples straight from the DBAPI cursor. A chart read is
    nearly all row handling, and SQLAlchemy's result rows cost about as much again as SQLite's
    own (measured: 31 ms against 18 ms for 15,632 rollup rows)."""
    conn = session.connection()
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    order = compiled.positiontup if compiled.positional else None
    cursor = conn.connection.cursor()
    try:
        cursor.execute(str(compiled), params if order is None else [params[n] for n in order])
        return cursor.fetchall()
    finally:
        cursor.close()


def _by_series(groups: dict[tuple[int, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of each (attempt, rank), read in the index's (attempt, step, rank) order and
    grouped as they came, concatenated in (attempt, rank) order: no sort needed."""
    out: list[dict[str, Any]] = []
    for key in sorted(groups):
        out.extend(groups[key])
    return out


def _raw_rows(session: Session, run_id: int, name_id: int, attempts: list[int],
              since_step: int | None) -> list[dict[str, Any]]:
    P = MetricPoint
    q = select(P.attempt, P.rank, P.step, P.value, P.wall_time).where(P.run_id == run_id, P.name_id == name_id)
    if since_step is not None:
        # The IN list lets the index seek straight to each attempt's first new step.
        q = q.where(P.attempt.in_(attempts), P.step >= since_step)
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    nan = NAN
    for attempt, rank, step, value, wall in _fetch_all(session, q.order_by(P.attempt, P.step, P.rank)):
        v = nan if value is None else value
        row = {"attempt": attempt, "rank": rank, "step": step, "last_step": step, "value": v, "min": v, "max": v,
               "last": v, "count": 1, "nan_count": 1 if value is None else 0, "wall_time": wall}
        try:
            groups[(attempt, rank)].append(row)
        except KeyError:
            groups[(attempt, rank)] = [row]
    return _by_series(groups)


def _bucket_rows(session: Session, run_id: int, name_id: int, level: int, attempts: list[int],
                 since_step: int | None) -> list[dict[str, Any]]:
    R = MetricRollup
    size = BASE**level
    # The mean in SQL: NULL when the bucket holds no non-NaN value or its sum is NaN (NULL).
    mean = case((R.count > R.nan_count, R.sum_value / (R.count - R.nan_count)))
    q = select(R.attempt, R.rank, R.bucket, R.last_step, mean, R.min_value, R.max_value, R.last_value, R.count,
               R.nan_count, R.last_time).where(R.run_id == run_id, R.name_id == name_id, R.level == level)
    if since_step is not None:
        q = q.where(R.attempt.in_(attempts), R.bucket >= since_step // size, R.last_step >= since_step)
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    nan = NAN
    for attempt, rank, bucket, last_step, avg, lo, hi, last, count, nans, wall in _fetch_all(
        session, q.order_by(R.attempt, R.bucket, R.rank)
    ):
        row = {
            "attempt": attempt, "rank": rank, "step": bucket * size, "last_step": last_step,
            "value": nan if avg is None else avg,
            "min": nan if lo is None else lo, "max": nan if hi is None else hi, "last": nan if last is None else last,
            "count": count, "nan_count": nans, "wall_time": wall,
        }
        try:
            groups[(attempt, rank)].append(row)
        except KeyError:
            groups[(attempt, rank)] = [row]
    return _by_series(groups)


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
        cutoffs: Per attempt, the last step still on the run's lineage (db.queries.lineage_cutoffs):
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


def totals(session: Session, run_id: int, key: str, *, attempt: int, rank: int,
           max_step: float | None = None) -> tuple[float, int]:
    """Sum and count of the non-NaN values of one series up to ``max_step`` (all steps when
    None), from the fewest rollup buckets that cover the range: a few dozen rows for any run."""
    name_id = _name_id(session, key)
    if name_id is None:
        return 0.0, 0
    R, P = MetricRollup, MetricPoint
    series_of = (R.run_id == run_id, R.name_id == name_id, R.attempt == attempt, R.rank == rank)
    if max_step is None or math.isinf(max_step):
        ranges, raw_from, hi = [(LEVELS, None, None)], None, None
    else:
        hi = int(max_step)
        ranges, covered = [], None
        for level in range(LEVELS, 0, -1):
            size = BASE**level
            end = (hi + 1) // size  # buckets before `end` hold only steps <= hi
            if covered is None or end * size > covered:
                ranges.append((level, None if covered is None else covered // size, end))
                covered = end * size
        raw_from = covered
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
