"""The CLI's data-set verbs: ``runyard db export FILE`` and ``runyard db import FILE`` (db/transfer.py).

Move a whole data set between databases, e.g. from the embedded SQLite to PostgreSQL::

    runyard db export runyard-export.jsonl.gz
    RUNYARD_DB_URL=postgresql+psycopg://user@host/runyard runyard db import runyard-export.jsonl.gz
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from db.engine import current_revision
from db.vocabulary.settings import load_settings
from orchestrator.cli.base import (
    EXIT_USAGE,
    RunyardCommand,
    fail,
    no_database_line,
    open_existing,
    open_sessions,
    safe_url,
)

PROGRESS_EVERY_S = 1.0


class Progress:
    """Rows done per table on stderr: at most once a second, and each table's total at its end."""

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self.shown_at = 0.0

    def __call__(self, table: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.shown_at < PROGRESS_EVERY_S:
            return
        self.shown_at = now
        percent = f" ({100 * done / total:.0f}%)" if total else ""
        click.echo(f"{self.verb} {table}: {done:,} of {total:,} rows{percent}", err=True)


@click.command("export", cls=RunyardCommand)
@click.argument("file", type=click.Path(dir_okay=False, writable=True, path_type=Path))
def db_export(file: Path) -> None:
    """Write the whole data set (every table) to FILE (gzip JSON lines), for `runyard db import`."""
    from db.transfer import export  # noqa: PLC0415 - only for this verb: every command imports this module (group.py)

    settings = load_settings()
    sessions = open_existing(settings)
    if sessions is None:
        fail(no_database_line(settings) + "; there is nothing to export")
    engine = sessions.kw["bind"]
    started = time.monotonic()
    summary = export(engine, file, current_revision(engine), Progress("exported"))
    click.echo(f"exported {sum(summary.rows.values()):,} rows of {len(summary.rows)} tables from "
               f"{safe_url(settings.db_url)} to {file} in {time.monotonic() - started:.1f} s")


@click.command("import", cls=RunyardCommand)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def db_import(file: Path) -> None:
    """Load FILE (from `runyard db export`) into this EMPTY database, all or nothing."""
    from db.transfer import TransferError, import_, read_header  # noqa: PLC0415 - only for this verb: every command imports this module (group.py)

    try:
        read_header(file)  # before a database is created for a file that is not an export
    except TransferError as exc:
        fail(str(exc), EXIT_USAGE)  # FILE is not an export this runyard reads: bad input
    settings = load_settings()
    engine = open_sessions(settings).kw["bind"]
    started = time.monotonic()
    try:
        summary = import_(engine, file, current_revision(engine), Progress("imported"))
    except TransferError as exc:
        fail(str(exc))
    click.echo(f"imported {sum(summary.rows.values()):,} rows of {len(summary.rows)} tables from {file} into "
               f"{safe_url(settings.db_url)} in {time.monotonic() - started:.1f} s")
