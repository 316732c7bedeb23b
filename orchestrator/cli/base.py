"""What every ``runyard`` command shares: the data-folder check, opening the database, and
errors as one line.

Every command of the CLI group is a :class:`RunyardCommand` (click's ``command_class``), so a
command added later gets the same treatment without code of its own: before its body runs the
data folder is checked (created by commands that write; only inspected by the read-only ones,
which never create a database), and a database problem ends the command with one sentence and
exit code 1 instead of a SQLAlchemy traceback.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import sys
from typing import Any, NoReturn

import click
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db import DatabaseError
from db.engine import check_read_only_schema, ensure_schema, make_engine, make_read_only_engine, make_sessionmaker
from db.engine import safe_url as hide_password
from db.home import PRIVATE_UMASK, check_home, database_writable, has_database, make_private
from db.vocabulary.settings import Settings, SettingsError, load_settings
from orchestrator import OrchestratorError
from orchestrator.format import duration

logger = logging.getLogger(__name__)

EXIT_FAILURE = 1
EXIT_USAGE = 2
# Commands that only read: they never create the data folder or a database, and they read a data
# folder that cannot be written (an archived copy, a read-only mount). ``export`` is `runyard db
# export`, which writes only the file it is given; ``preview`` and ``best`` are `runyard sweep`'s
# (its ``ls`` and ``show`` too).
READ_ONLY_COMMANDS = frozenset({"ls", "show", "logs", "metrics", "info", "export", "preview", "best"})
# Commands that create a missing data folder but show one that cannot be written instead of
# refusing it: the UI opens as a viewer there (every action disabled, a banner saying why), and
# `runyard token` prints the token that viewer asks for (it refuses only to create or replace one).
VIEWER_COMMANDS = frozenset({"ui", "token"})
# Commands that need no data folder at all.
NO_DATA_COMMANDS = frozenset({"config-reference"})


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def safe_url(url: str) -> str:
    """The database URL with any password hidden."""
    return hide_password(url)


def database_error_line(exc: SQLAlchemyError, settings: Settings) -> str:
    """One line for a database error: the database and the driver's own message."""
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"database {safe_url(settings.db_url)}: {detail[0] if detail else type(exc).__name__}"


class RunyardCommand(click.Command):
    """A command whose data folder is checked first and whose database errors end in one line."""

    def invoke(self, ctx: click.Context) -> Any:
        if self.name in NO_DATA_COMMANDS:
            return super().invoke(ctx)
        try:
            settings = load_settings()  # every RUNYARD_* variable checked: a bad one ends here, in one line
        except SettingsError as exc:
            fail(str(exc))
        os.umask(PRIVATE_UMASK)  # before anything is created: the home itself too
        try:
            reads_only = self.name in READ_ONLY_COMMANDS
            writable = check_home(settings, create=not reads_only,
                                  write=not reads_only and self.name not in VIEWER_COMMANDS)
            tightened = make_private(settings.home) if writable else 0
            if not writable and reads_only and settings.home.is_dir():
                click.echo(f"runyard: {settings.home} cannot be written; reading it as it is", err=True)
            if tightened:
                click.echo(f"runyard: made {tightened} paths under {settings.home} private to you (they were "
                           "readable by other accounts of this machine)", err=True)
            return super().invoke(ctx)
        except (DatabaseError, OrchestratorError) as exc:  # an unusable folder, a lock timeout, a bad env var
            fail(str(exc))
        except SQLAlchemyError as exc:
            logger.debug("database error", exc_info=True)
            fail(database_error_line(exc, settings))


class RunyardGroup(click.Group):
    """The ``runyard`` group: its commands and sub-groups are built as :class:`RunyardCommand`."""

    command_class = RunyardCommand
    group_class = type  # sub-groups (``runyard db``) are RunyardGroups too


def open_sessions(settings: Settings) -> sessionmaker[Session]:
    """A sessionmaker on an up-to-date schema; creates the database when there is none
    (migrations run once under a lock, whoever else starts at the same time)."""
    engine = make_engine(settings.db_url)
    ensure_schema(engine, settings.db_url, create=True)
    return make_sessionmaker(engine)


def open_existing(settings: Settings) -> sessionmaker[Session] | None:
    """A sessionmaker on the database if there is one (brought to the newest schema); ``None``
    when there is none yet. Never creates a database: read-only commands use this. A SQLite
    database in a folder that cannot be written is opened read-only and never migrated."""
    if not has_database(settings):
        return None
    if not database_writable(settings):  # an archived copy, a read-only mount: read it as it is
        engine = make_read_only_engine(settings.db_url)
        has_schema = check_read_only_schema(engine, settings.db_url)
    else:
        engine = make_engine(settings.db_url)
        has_schema = ensure_schema(engine, settings.db_url, create=False)
    if not has_schema:
        engine.dispose()
        return None
    return make_sessionmaker(engine)


def no_database_line(settings: Settings) -> str:
    """The sentence for a data folder without a database yet."""
    return (f"no database yet in {settings.home} ({settings.home_source}); "
            "`runyard submit CONFIG.toml` or `runyard up` creates it")


# -- what the commands share -------------------------------------------------------------------

# Ids, steps, ranks and attempts are stored as 64-bit integers.
INT64_MAX = 2**63 - 1
COUNT = click.IntRange(0, INT64_MAX)


def json_safe(obj: Any) -> Any:
    """NaN and infinities as null: JSON has no token for them (a NaN loss stays visible as null)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def existing_sessions(settings: Settings, run: str) -> sessionmaker[Session]:
    """The database of a read-only command about ``run``; exit 1 when there is none yet."""
    sessions = open_existing(settings)
    if sessions is None:
        fail(f"no run {run}: {no_database_line(settings)}")
    return sessions


def fmt_duration(seconds: float | None) -> str:
    """A duration without spaces, for tables (``1h02m``)."""
    return duration(seconds).replace(" ", "")


def fmt_time(ts: float | None) -> str:
    """A local wall-clock time, or ``-``."""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def resolve_ref(sessions: sessionmaker[Session], ref: str) -> int:
    """The id of the run ``ref`` names (an id or a name); exit 1 with a sentence when none does."""
    from db.queries import resolve_run  # noqa: PLC0415 - a run's rows only for a verb that names one: every command imports this module
    from db.requests import RunNotFound  # noqa: PLC0415 - a run's rows only for a verb that names one: every command imports this module

    with sessions() as session:
        try:
            return resolve_run(session, ref)
        except RunNotFound as exc:
            fail(str(exc))
            raise  # unreachable
