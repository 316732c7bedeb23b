"""The test fixtures that give a test SQLite and PostgreSQL: each case gets its own database of the
dialect it names, an empty one where it asks for one, and PostgreSQL asked for but missing fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from db.engine import make_engine

pytestmark = pytest.mark.both_dbs

ROOT = Path(__file__).resolve().parents[2]


def test_db_url_is_an_empty_database_of_the_case_dialect(db_url: str, db_dialect: str) -> None:
    engine = make_engine(db_url)
    try:
        assert engine.dialect.name == {"sqlite": "sqlite", "postgres": "postgresql"}[db_dialect]
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_pg_url_is_a_fresh_postgres_database_dropped_after(pg_url: str) -> None:
    engine = make_engine(pg_url)
    try:
        with engine.begin() as conn:
            assert conn.execute(text("SELECT current_database()")).scalar_one() == engine.url.database
            conn.execute(text("CREATE TABLE marker (x integer)"))
    finally:
        engine.dispose()


def test_settings_is_migrated_on_each_dialect(settings, db_dialect: str) -> None:
    engine = make_engine(settings.db_url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert {"runs", "attempts", "alembic_version"} <= tables
        assert engine.dialect.name.startswith(db_dialect[:6])
        assert os.environ["RUNYARD_DB_URL"] == settings.db_url
    finally:
        engine.dispose()


def test_postgres_asked_for_without_a_server_fails_not_skips(tmp_path: Path) -> None:
    case = tmp_path / "test_case.py"
    case.write_text("def test_x(pg_url):\n    assert pg_url\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RUNYARD_TEST_POSTGRES_URL", "RUNYARD_TEST_DB")}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    # tests/conftest.py loaded as a plugin, on a test file outside the tree
    common = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
              "--rootdir", str(tmp_path), str(case)]
    asked = subprocess.run([*common, "--db=both"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    not_asked = subprocess.run([*common, "-rs"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert asked.returncode == 1, asked.stdout
    assert "asks for PostgreSQL but $RUNYARD_TEST_POSTGRES_URL is not set" in asked.stdout
    assert not_asked.returncode == 0, not_asked.stdout
    assert "1 skipped" in not_asked.stdout and "set $RUNYARD_TEST_POSTGRES_URL" in not_asked.stdout
