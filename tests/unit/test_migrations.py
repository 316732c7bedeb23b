"""The Alembic migrations build exactly the schema the models describe, and go back down, on
SQLite and on PostgreSQL; an upgrade interrupted inside a migration leaves the database at the
last revision that completed (never half-way through one)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, text

from db.engine import (
    MigrationLockTimeout,
    _alembic_config,
    current_revision,
    head_revision,
    make_engine,
    migration_lock,
    upgrade,
)
from db.metricstore import write_points
from db.models import Base, held_on, include_object
from tests import databases

pytestmark = pytest.mark.both_dbs

RUN = ("INSERT INTO runs (name, status, config_json, config_hash, tags_json, max_steps, nproc, run_dir, "
       "price_usd_per_hour, price_unit, created_at, updated_at) VALUES "
       "('old', 'SUCCEEDED', '{}', 'h', '[]', 10, 2, '/x', 0.1, 'cpu', 1.0, 2.0)")


# The foreign keys that only SQLite holds (migration 0010): (table, column, referred table).
SQLITE_ONLY_KEYS = {
    ("metric_points", "run_id", "runs"), ("metric_points", "name_id", "metric_names"),
    ("metric_rollups", "run_id", "runs"), ("metric_rollups", "name_id", "metric_names"),
}
# What deletes a run's points and rollups on PostgreSQL instead of those keys' cascade.
POSTGRES_RUN_TRIGGERS = {"runs_delete_metrics", "runs_truncate_metrics"}


def _added_keys(diff: list) -> set[tuple[str, ...]]:
    return {(op[1].table.name, *op[1].column_keys, op[1].referred_table.name) for op in diff if op[0] == "add_fk"}


def _run_triggers(conn: Connection) -> set[str]:
    return set(conn.execute(text(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'runs'::regclass AND NOT tgisinternal")).scalars())


def test_upgraded_schema_matches_the_models(db_url: str, db_dialect: str) -> None:
    """SQLite's schema is exactly the models'. PostgreSQL's differs in exactly what migration
    0010 changed: the metric tables' keys are absent (the only difference found), and runs has
    the triggers that delete a run's points and rollups; the models say so (``held_on``), and
    the comparison that honours it (autogenerate's, db/migrations/env.py) finds nothing."""
    upgrade(db_url)
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        honoured = compare_metadata(MigrationContext.configure(
            conn, opts={"include_object": include_object(conn.dialect.name)}), Base.metadata)
        triggers = _run_triggers(conn) if db_dialect == "postgres" else set()
    engine.dispose()
    if db_dialect == "sqlite":
        assert diff == []
    else:
        assert len(diff) == len(SQLITE_ONLY_KEYS) and _added_keys(diff) == SQLITE_ONLY_KEYS
        assert triggers == POSTGRES_RUN_TRIGGERS
    assert honoured == []


def test_only_the_metric_keys_are_sqlite_only() -> None:
    """The models' dialect-only items are exactly those keys: every other constraint is held on
    both databases."""
    only_sqlite = {(t.name, *fk.column_keys, fk.referred_table.name)
                   for t in Base.metadata.sorted_tables for fk in t.foreign_key_constraints
                   if not held_on(fk, "postgresql")}
    assert only_sqlite == SQLITE_ONLY_KEYS
    assert all(held_on(c, "sqlite") for t in Base.metadata.sorted_tables for c in t.constraints)


def test_downgrade_to_base_and_up_again(db_url: str) -> None:
    upgrade(db_url)
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


def _metric_keys(engine: Engine) -> set[tuple[str | None, ...]]:
    """(table, name, column, referred table, ON DELETE) of each foreign key of the metric tables."""
    found = set()
    for name in ("metric_points", "metric_rollups"):
        for fk in inspect(engine).get_foreign_keys(name):
            found.add((name, fk["name"], *fk["constrained_columns"], fk["referred_table"],
                       fk.get("options", {}).get("ondelete")))
    return found


def _metric_rows(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return (conn.execute(text("SELECT count(*) FROM metric_points")).scalar_one(),
                conn.execute(text("SELECT count(*) FROM metric_rollups")).scalar_one())


def test_0010_goes_down_to_the_keys_and_up_again_keeping_the_points(db_url: str, db_dialect: str) -> None:
    """Down from 0010, PostgreSQL has its metric keys back under their original names (points of
    a run that is gone, possible only without them, deleted as the cascade would have) and no
    triggers; up again, the keys go and the triggers come back. SQLite's schema stays as it
    was. The run's own points and rollups survive both ways."""
    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(RUN))
            write_points(conn, [{"run_id": 1, "attempt": 1, "rank": r, "step": s, "key": "loss", "value": 1.0 / s,
                                 "wall_time": 100.0 + s} for s in range(1, 40) for r in (0, 1)])
        kept = _metric_rows(engine)
        if db_dialect == "postgres":
            assert _metric_keys(engine) == set()
            with engine.begin() as conn:  # a point of a run that does not exist: no key refuses it now
                conn.execute(text("INSERT INTO metric_points SELECT 99, name_id, attempt, step, rank, value, wall_time "
                                  "FROM metric_points"))
        command.downgrade(_alembic_config(db_url), "0009")
        assert current_revision(engine) == "0009"
        assert _metric_rows(engine) == kept
        expected = {(table, column, referred, "CASCADE" if column == "run_id" else None)
                    for table, column, referred in SQLITE_ONLY_KEYS}
        keys = _metric_keys(engine)
        assert {(table, column, referred, ondelete) for table, _name, column, referred, ondelete in keys} == expected
        if db_dialect == "postgres":
            assert {name for _table, name, *_rest in keys} == {f"{t}_{c}_fkey" for t, c, _r, _o in expected}
            with engine.connect() as conn:
                assert _run_triggers(conn) == set()
        upgrade(db_url)
        assert current_revision(engine) == head_revision()
        assert _metric_rows(engine) == kept
        if db_dialect == "postgres":
            assert _metric_keys(engine) == set()
            with engine.connect() as conn:
                assert _run_triggers(conn) == POSTGRES_RUN_TRIGGERS
    finally:
        engine.dispose()


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
            assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_an_interrupted_0010_leaves_the_metric_keys_in_place(db_url: str, db_dialect: str, tmp_path: Path) -> None:
    """Migration 0010 fails after dropping the keys and creating the triggers: PostgreSQL rolls it
    back whole (the database at 0009 with its four keys and no trigger), and a later upgrade with
    the real scripts reaches head."""
    cfg = _alembic_config(db_url)
    cfg.set_main_option("script_location", str(_scripts_failing_in(tmp_path, "0010")))
    with pytest.raises(RuntimeError, match="interrupted inside the migration"):
        command.upgrade(cfg, "head")
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) == "0009"
        assert len(_metric_keys(engine)) == 4
        if db_dialect == "postgres":
            with engine.connect() as conn:
                assert _run_triggers(conn) == set()
        upgrade(db_url)
        assert current_revision(engine) == head_revision()
        assert len(_metric_keys(engine)) == (0 if db_dialect == "postgres" else 4)
    finally:
        engine.dispose()


def test_a_postgres_migration_lock_waiter_goes_on_after_the_holder(pg_url: str) -> None:
    """While one connection holds the advisory migration lock, upgrade() waits (and times out
    with a message naming the lock); once it is released, upgrade() migrates."""
    with migration_lock(pg_url):
        with pytest.raises(MigrationLockTimeout, match="pg_advisory_lock") as info:
            upgrade(pg_url, timeout_s=0.5)
        assert "held by server pid" in str(info.value)
    upgrade(pg_url)
    engine = make_engine(pg_url)
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_the_schema_head_runyard_checks_without_alembic_is_alembics_newest_migration(tmp_path: Path) -> None:
    """db/engine.py's SCHEMA_HEAD (read by every command instead of importing Alembic) names the
    newest migration: adding one without moving it fails here."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert head_revision() == ScriptDirectory.from_config(_alembic_config(url)).get_current_head()
    engine = make_engine(url)
    try:
        assert current_revision(engine) is None  # no schema yet
        upgrade(url, "0004")
        with engine.connect() as conn:
            assert current_revision(engine) == MigrationContext.configure(conn).get_current_revision() == "0004"
    finally:
        engine.dispose()
