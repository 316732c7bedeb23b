"""PostgreSQL's write path of the metric store: each batch through binary COPY.

SQLite runs a batch's rows through the DBAPI's ``executemany`` (db/metricstore/writes.py), one cheap
in-process call a row. On PostgreSQL each row of an ``executemany`` is a statement the server
parses, plans and answers, and a batch sent as arrays spends its time quoting them; either
way ingest was five to eight times slower than SQLite's (docs/benchmarks-journal.md,
"PostgreSQL beside SQLite"). Here the points go in with ``COPY metric_points FROM STDIN (FORMAT
BINARY)`` (psycopg's C row writer; binary, because printing and parsing every float as text was
half of the COPY's time), and the rollups are copied into a temporary table of the connection
(emptied at each commit) and merged from there with one ``INSERT ... SELECT ... ON CONFLICT DO
UPDATE``, the same merge SQLite's upsert does (db/metricstore/rollups.py). Everything runs in the
caller's transaction. ``None`` is NULL, which is NaN, as everywhere in the store; infinities are
stored as such.

PostgreSQL holds no foreign keys on these two tables (the initial migration: its per-row key checks
were most of the server's ingest time). What they checked is checked here once a batch: the
batch's runs and metric names are read ``FOR KEY SHARE`` before its rows go in, so that a batch
for a run that is gone is refused, and a run deleted meanwhile waits for the batch's commit and
then deletes its points too (a trigger of the initial migration).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import BigInteger, Connection, Float, Integer, Table, column, event, select, table
from sqlalchemy.dialects import postgresql

from db.metricstore.rollups import ROLLUP_COLUMNS, BatchRollups, MetricStoreError, merge_rollups
from db.models import MetricPoint, MetricRollup

POINT_COLUMNS = ("run_id", "name_id", "attempt", "step", "rank", "value", "wall_time")
BATCH_TABLE = "metric_rollups_batch"
# Connection.info key: the connection's temporary table exists (see _batch_table).
_HAS_BATCH_TABLE = "runyard.metric_batch_table"
# Connection.info key: this transaction has put rows in it (see write_batch).
_BATCH_TABLE_ROWS = "runyard.metric_batch_rows"
_MERGE = merge_rollups(postgresql.insert(MetricRollup).from_select(
    list(ROLLUP_COLUMNS), select(*[column(c) for c in ROLLUP_COLUMNS]).select_from(table(BATCH_TABLE))), "postgresql")
# INTEGER's range: psycopg's binary writer wraps a larger Python int around instead of refusing it.
INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1
# One round trip before a batch's rows go in: its runs and names locked as a foreign key's check
# would lock each (FOR KEY SHARE), and the keys of its points already stored. Those are looked up
# one index seek per (run, attempt, name) through a LATERAL that the planner may not flatten
# (OFFSET 0): flattened, or written as `name_id = ANY(...)`, PostgreSQL scanned the run's whole
# index range with the name as a filter (1.1 ms at 30k points, growing with the run, against
# 0.06 ms for the seeks).
_HOLD_AND_FIND = (
    "WITH runs_held AS (SELECT id FROM runs WHERE id = ANY(%(runs)s::int4[]) FOR KEY SHARE), "
    "names_held AS (SELECT id FROM metric_names WHERE id = ANY(%(names)s::int4[]) FOR KEY SHARE), "
    "stored AS (SELECT p.run_id, p.name_id, p.attempt, p.step, p.rank "
    "FROM unnest(%(range_runs)s::int4[], %(range_attempts)s::int4[], %(los)s::int4[], %(his)s::int4[]) "
    "AS r(run_id, attempt, lo, hi) CROSS JOIN unnest(%(names)s::int4[]) AS n(id) "
    "CROSS JOIN LATERAL (SELECT run_id, name_id, attempt, step, rank FROM metric_points "
    "WHERE run_id = r.run_id AND name_id = n.id AND attempt = r.attempt AND step BETWEEN r.lo AND r.hi "
    "OFFSET 0) AS p) "
    "SELECT ARRAY(SELECT id FROM runs_held), ARRAY(SELECT id FROM names_held), "
    "ARRAY(SELECT ARRAY[run_id, name_id, attempt, step, rank] FROM stored)"
)


def copy_types(source: Table, columns: Iterable[str]) -> list[str]:
    """The PostgreSQL type of each of ``source``'s ``columns``, as binary COPY must send it (the
    server converts nothing: the bytes must be the column's own type)."""
    types = []
    for name in columns:
        kind = source.c[name].type
        if isinstance(kind, BigInteger):
            types.append("int8")
        elif isinstance(kind, Integer):
            types.append("int4")
        elif isinstance(kind, Float):
            types.append("float8")
        else:
            raise MetricStoreError(f"column {source.name}.{name} has type {kind!r}, which the binary COPY "
                                   "of the metric store does not write")
    return types


POINT_TYPES = copy_types(MetricPoint.__table__, POINT_COLUMNS)  # type: ignore[arg-type]
ROLLUP_TYPES = copy_types(MetricRollup.__table__, ROLLUP_COLUMNS)  # type: ignore[arg-type]


def _copy(conn: Connection, into: str, columns: tuple[str, ...], types: list[str], rows: list[tuple[Any, ...]]) -> None:
    cursor: Any = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        with cursor.copy(f"COPY {into} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row(row)
    finally:
        cursor.close()


def check_ranges(batch: BatchRollups) -> None:
    """Refuse a batch with a key that INTEGER cannot hold: binary COPY would store it wrapped
    around (text COPY refused it on the server).

    Raises:
        MetricStoreError: naming the key and the value.
    """
    for key, (low, high) in batch.key_ranges.items():
        for value in (low, high):
            if not INT4_MIN <= value <= INT4_MAX:
                raise MetricStoreError(f"metric point {key}={value} is outside PostgreSQL's INTEGER range "
                                       f"[{INT4_MIN}, {INT4_MAX}]; nothing of this batch was written")


def hold_and_find_stored(conn: Connection, step_ranges: dict[tuple[int, int], tuple[int, int]],
                         name_ids: set[int]) -> set[tuple[Any, ...]]:
    """Lock the batch's runs and names against deletion until commit, as a foreign key's check
    does for each row, and return the keys (run, name id, attempt, step, rank) of the points
    already stored in each (run, attempt)'s step range of the batch: what
    ``writes._already_stored`` finds on SQLite, in the same round trip.

    Raises:
        MetricStoreError: a run or metric name of the batch does not exist; nothing was written.
    """
    run_ids = {run for run, _attempt in step_ranges}
    ranges = sorted(step_ranges.items())
    runs, names, stored = conn.exec_driver_sql(_HOLD_AND_FIND, {
        "runs": sorted(run_ids), "names": sorted(name_ids),
        "range_runs": [run for (run, _), _ in ranges], "range_attempts": [attempt for (_, attempt), _ in ranges],
        "los": [lo for _, (lo, _) in ranges], "his": [hi for _, (_, hi) in ranges],
    }).one()
    missing_runs, missing_names = sorted(run_ids - set(runs)), sorted(name_ids - set(names))
    if missing_runs or missing_names:
        raise MetricStoreError(f"metric points for run_id {missing_runs} / name_id {missing_names} that do not "
                               "exist (deleted while the run was writing?); nothing of this batch was written")
    return set(map(tuple, stored))


def _batch_table(conn: Connection) -> None:
    """The connection's temporary table for a batch's rollups: created by the first batch of a
    connection, and again after a rollback (which may have taken it away)."""
    if conn.info.get(_HAS_BATCH_TABLE):
        return
    conn.exec_driver_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS {BATCH_TABLE} (LIKE metric_rollups) "
                         "ON COMMIT DELETE ROWS")
    conn.info[_HAS_BATCH_TABLE] = True
    event.listen(conn, "rollback", _forget_batch_table, once=True)


def _forget_batch_table(conn: Connection) -> None:
    conn.info.pop(_HAS_BATCH_TABLE, None)


def _forget_batch_rows(conn: Connection) -> None:
    conn.info.pop(_BATCH_TABLE_ROWS, None)


def write_batch(conn: Connection, points: list[tuple[Any, ...]], batch: BatchRollups) -> None:
    """Insert ``points`` (tuples in ``POINT_COLUMNS`` order, none stored yet) and merge the
    batch's rollups (``batch.rows``, tuples in ``ROLLUP_COLUMNS`` order) into the stored buckets,
    after :func:`check_ranges` and :func:`hold_and_find_stored` in the same transaction.
    """
    if not points:
        return
    _copy(conn, "metric_points", POINT_COLUMNS, POINT_TYPES, points)
    if batch.rows:
        _batch_table(conn)
        if conn.info.get(_BATCH_TABLE_ROWS):  # a second batch in one transaction: start empty
            conn.exec_driver_sql(f"DELETE FROM {BATCH_TABLE}")  # noqa: S608 - a constant table name
        _copy(conn, BATCH_TABLE, ROLLUP_COLUMNS, ROLLUP_TYPES, batch.rows)
        conn.execute(_MERGE)
        # The commit empties the table (ON COMMIT DELETE ROWS), a rollback takes the rows back.
        conn.info[_BATCH_TABLE_ROWS] = True
        event.listen(conn, "commit", _forget_batch_rows, once=True)
        event.listen(conn, "rollback", _forget_batch_rows, once=True)
