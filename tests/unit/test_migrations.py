"""The Alembic migrations build exactly the schema the models describe, and go back down."""

from __future__ import annotations

from pathlib import Path

import pytest
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
        conn.exec_driver_sql(
            "INSERT INTO metrics (run_id, attempt, rank, step, key, value, wall_time) VALUES (?, ?, ?, ?, ?, ?, ?)",
            OLD_METRICS,
        )
    upgrade(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT name, retries_used FROM runs").all() == [("old", 0)]
        assert conn.exec_driver_sql("SELECT overrides_json, retry_counted FROM attempts").all() == [("{}", 1)]
        # Every point survives (a point recorded twice keeps its first value), readable through
        # the old table's name and columns.
        survived = conn.exec_driver_sql(
            "SELECT run_id, attempt, rank, step, key, value, wall_time FROM metrics ORDER BY attempt, key, rank, step"
        ).all()
    first = {}
    for row in OLD_METRICS:
        first.setdefault(row[:5], row)
    assert survived == sorted(first.values(), key=lambda r: (r[1], r[4], r[2], r[3]))
    assert_rollups_match_the_store(url, engine)


# run, attempt, rank, step, key, value (None: NaN), time; one point twice, NaN, +-Inf, two attempts
OLD_METRICS = [
    (1, 1, r, s, k, None if s == 30 else (float("inf") if s == 70 else 1.0 / s + r), 100.0 + s)
    for s in range(10, 200, 10) for r in (0, 1) for k in ("loss", "lr")
] + [
    (1, 1, 0, 20, "loss", 99.0, 500.0),  # the same point again: the first one is kept
    (1, 2, 0, 150, "loss", float("-inf"), 600.0),
    (1, 2, 0, 160, "loss", 0.5, 601.0),
]


def assert_rollups_match_the_store(url: str, engine) -> None:  # type: ignore[no-untyped-def]
    """The rollups the migration built in SQL equal what db.metricstore writes for the same points."""
    from db.metricstore import write_points

    fresh_url = url.replace("old.db", "fresh.db")
    upgrade(fresh_url)
    fresh = make_engine(fresh_url)
    with fresh.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO runs (name, status, config_json, config_hash, tags_json, max_steps, nproc, run_dir, "
            "price_usd_per_hour, price_unit, created_at, updated_at) VALUES "
            "('old', 'SUCCEEDED', '{}', 'h', '[]', 10, 2, '/x', 0.1, 'cpu', 1.0, 2.0)"
        )
        write_points(conn, [
            {"run_id": run, "attempt": a, "rank": r, "step": s, "key": k, "value": float("nan") if v is None else v,
             "wall_time": t}
            for run, a, r, s, k, v, t in OLD_METRICS
        ])
    query = (
        "SELECT n.name, r.level, r.attempt, r.rank, r.bucket, r.min_value, r.max_value, r.sum_value, r.count, "
        "r.nan_count, r.first_step, r.last_step, r.first_time, r.last_time, r.last_value "
        "FROM metric_rollups r JOIN metric_names n ON n.id = r.name_id ORDER BY 1, 2, 3, 4, 5"
    )
    with engine.connect() as a, fresh.connect() as b:
        migrated, written = a.exec_driver_sql(query).all(), b.exec_driver_sql(query).all()
    fresh.dispose()
    assert len(migrated) == len(written) > 0
    for x, y in zip(migrated, written, strict=True):
        assert x[:7] == y[:7] and x[8:] == y[8:]
        assert x[7] == pytest.approx(y[7]) if y[7] is not None else x[7] is None
