"""PostgreSQL's write path of the metric store: each batch through COPY.

SQLite runs a batch's rows through the DBAPI's ``executemany`` (db/metricstore.py), one cheap
in-process call a row. On PostgreSQL each row of an ``executemany`` is a statement the server
parses, plans and answers, and a batch sent as arrays spends its time quoting them; either
way ingest was five to eight times slower than SQLite's (BENCHMARKS.md). Here the points go in
with ``COPY metric_points FROM STDIN`` (psycopg's C row writer), and the rollups are copied into
a temporary table of the connection (emptied at each commit) and merged from there with one
``INSERT ... SELECT ... ON CONFLICT DO UPDATE``, the same merge SQLite's upsert does
(db/metricrollups.py). Everything runs in the caller's transaction. ``None`` is NULL, which is
NaN, as everywhere in the store; infinities are copied as ``Infinity``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, column, select, table
from sqlalchemy.dialects import postgresql

from db.metricrollups import ROLLUP_COLUMNS, merge_rollups
from db.models import MetricRollup

POINT_COLUMNS = ("run_id", "name_id", "attempt", "step", "rank", "value", "wall_time")
BATCH_TABLE = "metric_rollups_batch"
_MERGE = postgresql.insert(MetricRollup).from_select(
    list(ROLLUP_COLUMNS), select(*[column(c) for c in ROLLUP_COLUMNS]).select_from(table(BATCH_TABLE)))


def _copy(conn: Connection, into: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    cursor: Any = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        with cursor.copy(f"COPY {into} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
    finally:
        cursor.close()


def _batch_table(conn: Connection) -> None:
    """The connection's temporary table for a batch's rollups. Created by the first batch of a
    connection, and again after a rollback took it away (one cheap statement a batch)."""
    conn.exec_driver_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS {BATCH_TABLE} (LIKE metric_rollups) "
                         "ON COMMIT DELETE ROWS")


def write_batch(conn: Connection, points: list[tuple], rollups: list[tuple]) -> None:
    """Insert ``points`` (tuples in ``POINT_COLUMNS`` order, none stored yet) and merge
    ``rollups`` (tuples in ``ROLLUP_COLUMNS`` order) into the stored buckets."""
    if points:
        _copy(conn, "metric_points", POINT_COLUMNS, points)
    if rollups:
        _batch_table(conn)
        _copy(conn, BATCH_TABLE, ROLLUP_COLUMNS, rollups)
        conn.execute(merge_rollups(_MERGE, "postgresql"))
        conn.exec_driver_sql(f"DELETE FROM {BATCH_TABLE}")  # the next batch of this transaction starts empty
