"""The metric store's write path: :func:`write_points` stores a batch of points and brings every
rollup level up to date (db/metricstore/__init__.py says how the tables are kept). SQLite runs a
batch through the DBAPI's ``executemany``; PostgreSQL through binary COPY (db/metricstore/bulk.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Insert, bindparam, event, insert, select

from db.metricstore.rollups import ROLLUP_COLUMNS, Point, dialect_insert, rollup_upsert, summarize
from db.models import MetricName, MetricPoint

# Where write_points keeps name -> id, and its compiled SQL, on the DBAPI connection
# (Connection.info), so that they live as long as the connection and no longer.
_NAME_CACHE = "runyard.metric_name_ids"
_SQL_CACHE = "runyard.metric_sql"
_POINT_COLUMNS = ("run_id", "name_id", "attempt", "step", "rank", "value", "wall_time")


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
        from db.metricstore.bulk import check_ranges, hold_and_find_stored, write_batch  # noqa: PLC0415 - PostgreSQL only (see above)

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
