"""A fresh PostgreSQL database per test: a minimal local stand-in, replaced by tests/conftest.py's
``pg_url`` fixture (branch pgcore) on merge. The server comes from ``RUNYARD_TEST_POSTGRES_URL``;
without it the PostgreSQL cases are skipped with that reason."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

SERVER_ENV = "RUNYARD_TEST_POSTGRES_URL"


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """Create an empty database on the test server, yield its URL, drop it afterwards."""
    server = os.environ.get(SERVER_ENV)
    if not server:
        pytest.skip(f"PostgreSQL cases need {SERVER_ENV} (a server URL; the user needs CREATEDB)")
    name = "runyard_test_" + uuid.uuid4().hex[:16]
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
