"""The Alembic migrations build exactly the schema the models describe, and go back down, on
SQLite and on PostgreSQL; an upgrade interrupted inside a migration leaves the database at the
last revision that completed (never half-way through one)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from db.engine import _alembic_config, current_revision, head_revision, make_engine, upgrade
from db.models import Base
from tests import databases

pytestmark = pytest.mark.both_dbs

RUN = ("INSERT INTO runs (name, status, config_json, config_hash, tags_json, max_steps, nproc, run_dir, "
       "price_usd_per_hour, price_unit, created_at, updated_at) VALUES "
       "('old', 'SUCCEEDED', '{}', 'h', '[]', 10, 2, '/x', 0.1, 'cpu', 1.0, 2.0)")


def test_upgraded_schema_matches_the_models(db_url: str) -> None:
    upgrade(db_url)
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_downgrade_to_base_and_up_again(db_url: str) -> None:
    upgrade(db_url)
    from alembic import command

    command.downgrade(_alembic_config(db_url), "base")
    engine = make_engine(db_url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(db_url)
    assert "checkpoints" in inspect(engine).get_table_names()
    engine.dispose()


def test_sqlite_pragmas_are_set(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000


def test_upgrade_keeps_existing_runs(db_url: str, db_dialect: str, tmp_path: Path,
                                     request: pytest.FixtureRequest) -> None:
    """A database with runs from the first release upgrades to head and keeps them, NaN and
    infinities included."""
    from alembic import command

    command.upgrade(_alembic_config(db_url), "0001")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text(RUN))
        conn.execute(text(
            "INSERT INTO attempts (run_id, number, status, dir, devices_json, device_kind, started_at) "
            "VALUES (1, 1, 'SUCCEEDED', '/x/1', '[]', 'cpu', 1.0)"
        ))
        conn.execute(text(
            "INSERT INTO metrics (run_id, attempt, rank, step, key, value, wall_time) "
            "VALUES (:run, :attempt, :rank, :step, :key, :value, :at)"),
            [dict(zip(("run", "attempt", "rank", "step", "key", "value", "at"), row, strict=True))
             for row in OLD_METRICS],
        )
    upgrade(db_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name, retries_used FROM runs")).all() == [("old", 0)]
        assert [tuple(r) for r in conn.execute(text("SELECT overrides_json, retry_counted FROM attempts"))] \
            in ([("{}", 1)], [("{}", True)])
        # Every point survives (a point recorded twice keeps its first value), readable through
        # the old table's name and columns.
        survived = conn.execute(text(
            "SELECT run_id, attempt, rank, step, key, value, wall_time FROM metrics ORDER BY attempt, key, rank, step"
        )).all()
    first: dict[tuple, tuple] = {}
    for row in OLD_METRICS:
        first.setdefault(row[:5], row)
    assert [tuple(r) for r in survived] == sorted(first.values(), key=lambda r: (r[1], r[4], r[2], r[3]))
    if db_dialect == "sqlite":
        fresh_url = f"sqlite:///{tmp_path / 'fresh.db'}"
        assert_rollups_match_the_store(fresh_url, engine)
    else:
        with databases.fresh_database(request.getfixturevalue("pg_server")) as fresh_url:
            assert_rollups_match_the_store(fresh_url, engine)
    engine.dispose()


# run, attempt, rank, step, key, value (None: NaN), time; one point twice, NaN, +-Inf, two attempts
OLD_METRICS = [
    (1, 1, r, s, k, None if s == 30 else (float("inf") if s == 70 else 1.0 / s + r), 100.0 + s)
    for s in range(10, 200, 10) for r in (0, 1) for k in ("loss", "lr")
] + [
    (1, 1, 0, 20, "loss", 99.0, 500.0),  # the same point again: the first one is kept
    (1, 2, 0, 150, "loss", float("-inf"), 600.0),
    (1, 2, 0, 160, "loss", 0.5, 601.0),
]


def assert_rollups_match_the_store(fresh_url: str, engine) -> None:  # type: ignore[no-untyped-def]
    """The rollups the migration built in SQL equal what db.metricstore writes for the same points."""
    from db.metricstore import write_points

    upgrade(fresh_url)
    fresh = make_engine(fresh_url)
    with fresh.begin() as conn:
        conn.execute(text(RUN))
        write_points(conn, [
            {"run_id": run, "attempt": a, "rank": r, "step": s, "key": k, "value": float("nan") if v is None else v,
             "wall_time": t}
            for run, a, r, s, k, v, t in OLD_METRICS
        ])
    query = text(
        "SELECT n.name, r.level, r.attempt, r.rank, r.bucket, r.min_value, r.max_value, r.sum_value, r.count, "
        "r.nan_count, r.first_step, r.last_step, r.first_time, r.last_time, r.last_value "
        "FROM metric_rollups r JOIN metric_names n ON n.id = r.name_id ORDER BY 1, 2, 3, 4, 5"
    )
    with engine.connect() as a, fresh.connect() as b:
        migrated, written = a.execute(query).all(), b.execute(query).all()
    fresh.dispose()
    assert len(migrated) == len(written) > 0
    for x, y in zip(migrated, written, strict=True):
        assert x[:7] == y[:7] and x[8:] == y[8:]
        assert x[7] == pytest.approx(y[7]) if y[7] is not None else x[7] is None


def _scripts_failing_in(tmp_path: Path, revision: str) -> Path:
    """A copy of the migrations in which ``revision`` raises after doing all its work."""
    src = Path(_alembic_config("sqlite://").get_main_option("script_location") or "")
    dst = tmp_path / "migrations"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    (script,) = (dst / "versions").glob(f"{revision}_*.py")
    script.write_text(script.read_text() + (
        "\n\n_real_upgrade = upgrade\n\n\ndef upgrade() -> None:\n    _real_upgrade()\n"
        "    raise RuntimeError('interrupted inside the migration')\n"))
    return dst


def test_an_interrupted_upgrade_stops_at_the_last_completed_revision(db_url: str, db_dialect: str,
                                                                     tmp_path: Path) -> None:
    """Migration 0005 (the metric store) fails after creating its tables: the database stays at
    0004 with none of 0005's tables, and a later upgrade with the real scripts reaches head.
    PostgreSQL runs each migration in a transaction; SQLite's DDL is not transactional, so there
    only the revision is checked."""
    from alembic import command

    cfg = _alembic_config(db_url)
    cfg.set_main_option("script_location", str(_scripts_failing_in(tmp_path, "0005")))
    with pytest.raises(RuntimeError, match="interrupted inside the migration"):
        command.upgrade(cfg, "head")
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) == "0004"
        tables = set(inspect(engine).get_table_names())
        assert {"runs", "attempts", "checkpoints", "prices"} <= tables
        if db_dialect == "postgres":
            assert not tables & {"metric_names", "metric_points", "metric_rollups"}
            assert "metrics" in tables  # 0005 dropped it; the rollback brought it back
            upgrade(db_url)
            assert current_revision(engine) == head_revision(db_url)
    finally:
        engine.dispose()


def test_a_postgres_migration_lock_waiter_goes_on_after_the_holder(pg_url: str) -> None:
    """While one connection holds the advisory migration lock, upgrade() waits (and times out
    with a message naming the lock); once it is released, upgrade() migrates."""
    from db.engine import MigrationLockTimeout, migration_lock

    with migration_lock(pg_url):
        with pytest.raises(MigrationLockTimeout, match="pg_advisory_lock") as info:
            upgrade(pg_url, timeout_s=0.5)
        assert "held by server pid" in str(info.value)
    upgrade(pg_url)
    engine = make_engine(pg_url)
    assert current_revision(engine) == head_revision(pg_url)
    engine.dispose()
