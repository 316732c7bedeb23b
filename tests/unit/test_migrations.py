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
