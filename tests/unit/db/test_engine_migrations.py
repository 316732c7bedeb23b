"""The Alembic migration builds exactly the schema the models describe, and goes back down, on
SQLite and on PostgreSQL; an upgrade interrupted inside a migration leaves the database at the
last revision that completed (never half-way through one); a database made by a pre-release
runyard (whose fourteen migrations were squashed into one) is named, with what to do, and one at
the pre-release head (the same schema) is taken as the first release's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text
from sqlalchemy.engine import make_url

from db.engine import (
    FIRST_RELEASE,
    PRE_RELEASE_HEAD,
    MigrationLockTimeout,
    SchemaOutdated,
    SchemaPreRelease,
    _alembic_config,
    check_read_only_schema,
    current_revision,
    ensure_schema,
    head_revision,
    make_engine,
    migration_lock,
    upgrade,
)
from db.models import Base, held_on, include_object

pytestmark = pytest.mark.both_dbs

RUN = ("INSERT INTO runs (name, status, config_json, config_hash, tags_json, max_steps, nproc, run_dir, "
       "price_usd_per_hour, price_unit, created_at, updated_at) VALUES "
       "('old', 'SUCCEEDED', '{}', 'h', '[]', 10, 2, '/x', 0.1, 'cpu', 1.0, 2.0)")


# The foreign keys that only SQLite holds (the initial migration): (table, column, referred table).
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
    """SQLite's schema is exactly the models'. PostgreSQL's differs in exactly what the initial
    migration does there only: the metric tables' keys are absent (the only difference found), and runs has
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
        assert (conn.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0) >= 5000


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
    """The initial migration fails after doing all its work: the database stays without a
    revision, and on PostgreSQL (each migration in a transaction) without any of its tables,
    views, functions or triggers; a later upgrade with the real scripts reaches head. SQLite's
    DDL is not transactional, so there only the revision is checked."""

    cfg = _alembic_config(db_url)
    cfg.set_main_option("script_location", str(_scripts_failing_in(tmp_path, FIRST_RELEASE)))
    with pytest.raises(RuntimeError, match="interrupted inside the migration"):
        command.upgrade(cfg, "head")
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) is None
        if db_dialect == "postgres":
            assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
            assert inspect(engine).get_view_names() == []
            with engine.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM pg_proc WHERE proname IN "
                                         "('delete_run_metrics', 'truncate_run_metrics')")).scalar_one() == 0
            upgrade(db_url)
            assert current_revision(engine) == head_revision()
            with engine.connect() as conn:
                assert _run_triggers(conn) == POSTGRES_RUN_TRIGGERS
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
        upgrade(url)
        with engine.connect() as conn:
            alembics = MigrationContext.configure(conn).get_current_revision()
        assert current_revision(engine) == alembics == head_revision()
    finally:
        engine.dispose()


# -- databases made by a pre-release runyard ---------------------------------------------------


def _stamp(url: str, revision: str) -> None:
    """Set the database's recorded revision, as a pre-release runyard would have left it."""
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    engine.dispose()


def test_a_pre_release_database_is_named_with_what_to_do(db_url: str, db_dialect: str) -> None:
    """A database at a revision of the squashed pre-release migrations is refused by every schema
    check (the writers', the readers', the read-only one, ``runyard db upgrade``'s) with one
    sentence: what made it, which revision, and what to do; never Alembic's "Can't locate
    revision". Nothing is changed in it."""
    upgrade(db_url)
    _stamp(db_url, "0009")
    engine = make_engine(db_url)
    if db_dialect == "sqlite":
        home = Path(db_url.removeprefix("sqlite:///")).parent
        expected = (f"data folder {home} was made by a pre-release runyard (schema revision 0009_scheduler_leases), "
                    "which this runyard cannot read or upgrade: start with a new data folder (set RUNYARD_HOME to an "
                    f"empty one), or delete {home / 'runyard.db'} and {home / 'runs'} to start this one afresh")
    else:
        expected = (f"database {make_url(db_url).render_as_string(hide_password=True)} was made by a pre-release "
                    "runyard (schema revision 0009_scheduler_leases), which this runyard cannot read or upgrade: "
                    "point RUNYARD_DB_URL at a new, empty database (or drop and re-create this one)")
    try:
        for check in (lambda: ensure_schema(engine, db_url), lambda: ensure_schema(engine, db_url, create=False),
                      lambda: check_read_only_schema(engine, db_url), lambda: upgrade(db_url)):
            with pytest.raises(SchemaPreRelease) as info:
                check()
            assert str(info.value) == expected
        assert current_revision(engine) == "0009"
    finally:
        engine.dispose()


def test_a_database_at_the_pre_release_head_is_taken_as_the_first_release(db_url: str) -> None:
    """The pre-release head built the very schema of the first release: read-only it is that
    release's (behind the newest once a later migration exists, and said so as for a first-release
    database), and the first process that may write restamps it and upgrades it from there
    (``runyard db upgrade`` too)."""
    upgrade(db_url, FIRST_RELEASE)
    _stamp(db_url, PRE_RELEASE_HEAD)
    engine = make_engine(db_url)
    try:
        if head_revision() == FIRST_RELEASE:
            assert check_read_only_schema(engine, db_url) is True
        else:
            with pytest.raises(SchemaOutdated, match=f"at revision {PRE_RELEASE_HEAD} .*upgrade a writable copy"):
                check_read_only_schema(engine, db_url)
        assert current_revision(engine) == PRE_RELEASE_HEAD
        assert ensure_schema(engine, db_url, create=False) is True
        assert current_revision(engine) == head_revision()
        command.downgrade(_alembic_config(db_url), FIRST_RELEASE)
        _stamp(db_url, PRE_RELEASE_HEAD)
        upgrade(db_url)
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
