"""Test databases on both dialects: a SQLite file in ``tmp_path`` or a fresh PostgreSQL database.

The PostgreSQL server comes from the environment variable ``RUNYARD_TEST_POSTGRES_URL`` (a
SQLAlchemy URL of a database on it that the test user may connect to, such as
``postgresql+psycopg://runyard@127.0.0.1:55432/postgres``; the user needs CREATEDB). Each test
that asks gets its own database, created with a unique name and dropped afterwards, so tests
never see each other's rows. ``.ci/run`` starts a throwaway server and sets the variable
(tests/services/postgres.sh).

Which dialects run is chosen with pytest's ``--db`` option (or ``RUNYARD_TEST_DB``):

- ``auto`` (the default): SQLite always; PostgreSQL when ``RUNYARD_TEST_POSTGRES_URL`` is set,
  otherwise the PostgreSQL cases are skipped with a one-line reason.
- ``both`` / ``postgres``: PostgreSQL is required: without a reachable server its cases FAIL
  (CI asks for ``both``: a missing server must never pass silently). ``postgres`` skips the
  SQLite cases.
- ``sqlite``: the PostgreSQL cases are skipped, by that explicit choice.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from db.queries import run_detail as detail
from orchestrator.cli.base import json_safe

SERVER_ENV = "RUNYARD_TEST_POSTGRES_URL"
CHOICE_ENV = "RUNYARD_TEST_DB"
CHOICES = ("auto", "both", "sqlite", "postgres")
DIALECTS = ("sqlite", "postgres")
NAME_PREFIX = "runyard_test_"


class PostgresUnavailable(RuntimeError):
    """PostgreSQL was asked for but there is no server to use."""


def server_url() -> str | None:
    """The PostgreSQL server's URL from the environment, or ``None``."""
    return os.environ.get(SERVER_ENV) or None


def _admin_engine(server: str) -> Engine:
    return create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)


def database_url(server: str, name: str) -> str:
    """``server`` pointed at database ``name`` (the password kept, for the test's own use)."""
    url: URL = make_url(server).set(database=name)
    return url.render_as_string(hide_password=False)


def create_database(server: str, template: str | None = None) -> str:
    """Create a database with a unique name on ``server`` (a copy of ``template`` if given) and
    return its URL.

    Raises:
        PostgresUnavailable: the server cannot be reached; the message says which URL and why.
    """
    name = NAME_PREFIX + uuid.uuid4().hex[:16]
    engine = _admin_engine(server)
    try:
        try:
            conn = engine.connect()
        except OperationalError as exc:
            shown = make_url(server).render_as_string(hide_password=True)
            reason = str(exc.orig or exc).strip().splitlines()[0]
            raise PostgresUnavailable(
                f"cannot reach the PostgreSQL server of {SERVER_ENV} ({shown}): {reason}") from exc
        with conn:
            clause = f' TEMPLATE "{template}"' if template else ""
            conn.execute(text(f'CREATE DATABASE "{name}"{clause}'))
    finally:
        engine.dispose()
    return database_url(server, name)


def drop_database(server: str, url: str) -> None:
    """Drop the database of ``url`` from ``server``, closing any connection left to it."""
    name = make_url(url).database
    engine = _admin_engine(server)
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


@contextlib.contextmanager
def fresh_database(server: str, template: str | None = None) -> Iterator[str]:
    """A new database on ``server`` for the duration of the block; dropped afterwards."""
    url = create_database(server, template)
    try:
        yield url
    finally:
        drop_database(server, url)


def run_detail(url: str, run_id: int) -> dict:
    """What ``runyard show RUN --json`` prints, read in this process on a connection opened for
    the call. Waiting tests poll this: polling through the CLI cost 0.55-0.7 s of CPU a call,
    taken from the ranks they wait for on two cores. ``show`` still runs the real CLI where a
    test reads its output."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with Session(engine) as session:
            return json.loads(json.dumps(json_safe(detail(session, run_id))))
    finally:
        engine.dispose()
