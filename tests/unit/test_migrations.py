"""The Alembic migrations build exactly the schema the models describe, and go back down."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from db.engine import make_engine, upgrade
from db.models import Base


def test_upgraded_schema_matches_the_models(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_downgrade_to_base_and_up_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    from alembic import command

    from db.engine import _alembic_config

    command.downgrade(_alembic_config(url), "base")
    assert set(inspect(make_engine(url)).get_table_names()) <= {"alembic_version"}
    upgrade(url)
    assert "checkpoints" in inspect(make_engine(url)).get_table_names()


def test_sqlite_pragmas_are_set(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000


def test_upgrade_keeps_existing_runs(tmp_path: Path) -> None:
    """A database with runs from the first release upgrades to head and keeps them."""
    from alembic import command

    from db.engine import _alembic_config

    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(_alembic_config(url), "0001")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO runs (name, status, config_json, config_hash, tags_json, max_steps, nproc, run_dir, "
            "price_usd_per_hour, price_unit, created_at, updated_at) VALUES "
            "('old', 'SUCCEEDED', '{}', 'h', '[]', 10, 2, '/x', 0.1, 'cpu', 1.0, 2.0)"
        )
        conn.exec_driver_sql(
            "INSERT INTO attempts (run_id, number, status, dir, devices_json, device_kind, started_at) "
            "VALUES (1, 1, 'SUCCEEDED', '/x/1', '[]', 'cpu', 1.0)"
        )
    upgrade(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT name, retries_used FROM runs").all() == [("old", 0)]
        assert conn.exec_driver_sql("SELECT overrides_json, retry_counted FROM attempts").all() == [("{}", 1)]
