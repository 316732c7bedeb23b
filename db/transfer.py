"""Move a whole data set between databases: ``runyard db export FILE`` / ``runyard db import FILE``.

The file is gzip-compressed JSON lines, the same for SQLite and PostgreSQL::

    {"format": "runyard-export", "version": 1, "schema": "r001", "tables": ["runs", ...]}
    {"table": "runs", "columns": ["id", "name", ...], "rows": 12}
    [1, "digits-ddp", ...]                      one JSON array per row, in primary-key order
    ...

Every table of the schema is written except ``alembic_version`` (the header names the
revision instead). Values keep their exact type across dialects: times are epoch floats written
with Python's shortest round-tripping repr, NaN and infinities as ``NaN``/``Infinity`` (JSON as
Python reads and writes it), booleans as JSON booleans, ids as they are, so that every reference
holds in the new database.

Import loads into an EMPTY database at the same schema revision, in one transaction: it fails
as a whole or lands as a whole. Foreign keys stay checked: tables go in dependency order, and the
columns that close a cycle (a run's parent checkpoint, its resume checkpoint, its parent run) are
filled in after the rows they point to exist (PostgreSQL holds no keys on the metric points and
rollups, see the initial migration; they still go in after their runs and names, the models' order).
PostgreSQL's id sequences are moved past the imported ids, so that new rows do not collide with
them.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Connection, Engine, Table, func, select, text, update

from db import DatabaseError
from db.models import Base

logger = logging.getLogger(__name__)

FORMAT = "runyard-export"
VERSION = 1
BATCH_ROWS = 5000

# (table, rows done, rows in the table): called every BATCH_ROWS rows and at each table's end.
Progress = Callable[[str, int, int], None]


class TransferError(DatabaseError):
    """An export file that cannot be imported here, or a database that cannot take it."""


@dataclass(frozen=True)
class Summary:
    """What was moved: rows per table, in the order written."""

    schema: str | None
    rows: dict[str, int]


def tables() -> list[Table]:
    """Every table of the schema, in an order where each one's references come before it."""
    return list(Base.metadata.sorted_tables)


def deferred_columns(table: Table) -> list[str]:
    """The columns filled in after all rows exist: foreign keys that close a cycle (``use_alter``)
    or point into their own table."""
    names = []
    for fk in table.foreign_keys:
        if fk.constraint is not None and (fk.constraint.use_alter or fk.column.table is table):
            names.append(fk.parent.name)
    return sorted(set(names))


def _noop(_table: str, _done: int, _total: int) -> None:
    return None


# -- export ------------------------------------------------------------------------------------

def export(engine: Engine, path: Path, schema: str | None, progress: Progress = _noop) -> Summary:
    """Write every table of ``engine``'s database to ``path`` (created or replaced).

    The rows are read in one transaction (a consistent snapshot on PostgreSQL; on SQLite a read
    transaction that writers do not disturb in WAL mode) and streamed, never all in memory.
    """
    rows: dict[str, int] = {}
    partial = path.with_name(path.name + ".partial")
    # Level 1: a third of level 6's time, and the file only about a quarter larger.
    with gzip.open(partial, "wt", encoding="utf-8", compresslevel=1) as out, engine.connect() as conn, conn.begin():
        out.write(_line({"format": FORMAT, "version": VERSION, "schema": schema,
                         "tables": [t.name for t in tables()]}))
        for table in tables():
            rows[table.name] = _export_table(conn, table, out, progress)
    partial.replace(path)  # a file named FILE is always a whole export
    return Summary(schema, rows)


def _export_table(conn: Connection, table: Table, out: IO[str], progress: Progress) -> int:
    total = conn.scalar(select(func.count()).select_from(table)) or 0
    columns = [c.name for c in table.columns]
    out.write(_line({"table": table.name, "columns": columns, "rows": total}))
    order = list(table.primary_key.columns) or list(table.columns)
    done = 0
    encode = _encoder().encode
    result = conn.execution_options(stream_results=True, yield_per=BATCH_ROWS).execute(
        select(*table.columns).order_by(*order))
    for rows in result.partitions(BATCH_ROWS):
        out.write("".join(encode(list(row)) + "\n" for row in rows))
        done += len(rows)
        progress(table.name, done, total)
    if done != total:
        raise TransferError(f"table {table.name}: counted {total} rows but read {done}; export again")
    progress(table.name, done, total)
    return done


def _encoder() -> json.JSONEncoder:
    return json.JSONEncoder(separators=(",", ":"), allow_nan=True)


def _line(value: Any) -> str:
    return _encoder().encode(value) + "\n"


# -- import ------------------------------------------------------------------------------------

def read_header(path: Path) -> dict[str, Any]:
    """The export's header line.

    Raises:
        TransferError: the file is not a runyard export (or not one this runyard reads).
    """
    try:
        with gzip.open(path, "rt", encoding="utf-8") as src:
            header = json.loads(src.readline())
    except (OSError, EOFError, ValueError) as exc:
        raise TransferError(f"{path} is not a runyard export ({exc}); write one with `runyard db export FILE`") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TransferError(f"{path} is not a runyard export (no {FORMAT!r} header); "
                            "write one with `runyard db export FILE`")
    if header.get("version") != VERSION:
        raise TransferError(f"{path} is export format version {header.get('version')!r}; this runyard reads "
                            f"version {VERSION}: import it with the runyard that wrote it")
    return header


def nonempty_tables(conn: Connection) -> dict[str, int]:
    """The tables that hold rows, with their counts."""
    counts = {t.name: conn.scalar(select(func.count()).select_from(t)) or 0 for t in tables()}
    return {name: n for name, n in counts.items() if n}


def import_(engine: Engine, path: Path, schema: str | None, progress: Progress = _noop) -> Summary:
    """Load the export at ``path`` into ``engine``'s empty database at revision ``schema``.

    Raises:
        TransferError: the file is not an export, was written at another schema revision, or
            the database is not empty; nothing was written.
    """
    header = read_header(path)
    if header.get("schema") != schema:
        raise TransferError(
            f"{path} was exported at schema revision {header.get('schema')!r}, this database is at {schema!r}: "
            "import into a database at the same revision (the runyard version that wrote the file), "
            "then upgrade it with `runyard db upgrade`")
    known = {t.name: t for t in tables()}
    rows: dict[str, int] = {}
    with engine.begin() as conn:
        full = nonempty_tables(conn)
        if full:
            listed = ", ".join(f"{name} ({n} rows)" for name, n in full.items())
            raise TransferError(
                f"the database {engine.url.render_as_string(hide_password=True)} is not empty: {listed}; "
                "import only into an empty database (point RUNYARD_DB_URL at a new one), nothing was imported")
        deferred: list[tuple[Table, list[str], list[dict[str, Any]]]] = []
        for name, columns, total, lines in _sections(path):
            table = known.get(name)
            if table is None or [c.name for c in table.columns] != columns:
                raise TransferError(f"{path}: table {name!r} with columns {columns} does not match this schema; "
                                    "the file was edited or written by another runyard; nothing was imported")
            later = deferred_columns(table)
            rows[name], held = _import_table(conn, table, columns, total, lines, later, progress)
            if held:
                deferred.append((table, later, held))
        for table, later, held in deferred:
            _fill_deferred(conn, table, later, held)
        if conn.dialect.name == "postgresql":
            reset_sequences(conn)
    return Summary(schema, rows)


def _sections(path: Path) -> Iterator[tuple[str, list[str], int, Iterator[str]]]:
    """(table, columns, rows, its row lines) for each table of the file, in order."""
    with gzip.open(path, "rt", encoding="utf-8") as src:
        src.readline()  # the header
        while line := src.readline():
            section = json.loads(line)
            total = int(section["rows"])
            yield section["table"], list(section["columns"]), total, (src.readline() for _ in range(total))


def _import_table(conn: Connection, table: Table, columns: list[str], total: int, lines: Iterator[str],
                  later: list[str], progress: Progress) -> tuple[int, list[dict[str, Any]]]:
    """Insert a table's rows in batches; the ``later`` columns are inserted NULL and their values
    returned (with the primary key) for :func:`_fill_deferred`."""
    keys = [columns.index(c.name) for c in table.primary_key.columns]
    late = [columns.index(c) for c in later]
    held: list[dict[str, Any]] = []
    batch: list[list[Any]] = []
    done = 0
    for line in lines:
        if not line:
            raise TransferError(f"table {table.name}: the file ends after {done} of {total} rows; nothing was imported")
        row = json.loads(line)
        if len(row) != len(columns):
            raise TransferError(f"table {table.name}: row {done + 1} has {len(row)} values for {len(columns)} columns; "
                                "nothing was imported")
        if late and any(row[i] is not None for i in late):
            held.append({columns[i]: row[i] for i in keys + late})
            for i in late:
                row[i] = None
        batch.append(row)
        done += 1
        if len(batch) >= BATCH_ROWS:
            _insert(conn, table, columns, batch)
            batch = []
            progress(table.name, done, total)
    if batch:
        _insert(conn, table, columns, batch)
    progress(table.name, done, total)
    return done, held


def _insert(conn: Connection, table: Table, columns: list[str], rows: list[list[Any]]) -> None:
    """Insert rows given as value lists: PostgreSQL through COPY (several times faster than
    INSERTs; it takes NaN, infinities and booleans as they are), others through executemany."""
    if conn.dialect.name != "postgresql":
        conn.execute(table.insert(), [dict(zip(columns, row, strict=True)) for row in rows])
        return
    quoted = ", ".join(f'"{c}"' for c in columns)
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cursor, cursor.copy(f'COPY "{table.name}" ({quoted}) FROM STDIN') as copy:
        for row in rows:
            copy.write_row(row)


def _fill_deferred(conn: Connection, table: Table, later: list[str], held: list[dict[str, Any]]) -> None:
    keys = list(table.primary_key.columns)
    for row in held:
        conn.execute(update(table).where(*(k == row[k.name] for k in keys)).values({c: row[c] for c in later}))


def reset_sequences(conn: Connection) -> None:
    """Move each PostgreSQL id sequence past the largest id in its table (ids were inserted
    explicitly, which does not advance the sequence)."""
    for table in tables():
        keys = list(table.primary_key.columns)
        if len(keys) != 1 or not keys[0].autoincrement or keys[0].type.python_type is not int:
            continue
        sequence = conn.scalar(text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table.name, "c": keys[0].name})
        if sequence is None:
            continue
        top = conn.scalar(select(func.max(keys[0])))
        conn.execute(text("SELECT setval(CAST(:s AS regclass), :v, :called)"),
                     {"s": sequence, "v": top if top is not None else 1, "called": top is not None})
