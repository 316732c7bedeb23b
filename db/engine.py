"""Engine and session set-up, SQLite pragmas, and schema upgrades through Alembic.

Migrations run once, under a lock: the scheduler, the UI and a `runyard submit` started together
on a fresh data folder would otherwise all create the same tables at once (one of them died with
a ``CircularDependencyError``). The first process migrates; the others wait and go on. The lock
is a file lock beside a SQLite database and ``pg_advisory_lock`` on PostgreSQL.

Connections are budgeted on a server database: each process's engine is a small pool
(``POOL_SIZE`` kept, ``POOL_OVERFLOW`` more at peaks) checked with ``pool_pre_ping``; rank 0's
writer asks for ``pool_size=1, max_overflow=0`` (one connection, opened at its first write).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

if TYPE_CHECKING:
    from alembic.config import Config

from db import DatabaseError
from db.vocabulary.layout import MIGRATE_LOCK_FILE, RUNS_DIR

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 10_000
# A process's pool on a server database: kept connections, and how many more it may open at a peak.
POOL_SIZE = 2
POOL_OVERFLOW = 3
# pg_advisory_lock key of the migration lock (any fixed 64-bit number; "runyard" in ASCII).
PG_MIGRATE_LOCK_KEY = 0x72756E79617264
# A migration of a large metric table can take minutes; a lock held longer than this is stuck.
MIGRATE_LOCK_TIMEOUT_S = 600.0


class MigrationLockTimeout(DatabaseError):
    """Another process held the migration lock for longer than the timeout."""


class SchemaOutdated(DatabaseError):
    """A database that cannot be written is at an older schema than this runyard's; it cannot
    be migrated where it lies."""


class SchemaUnknown(DatabaseError):
    """The database is at a schema revision this version of runyard does not have (a newer
    runyard wrote it)."""


class SchemaPreRelease(DatabaseError):
    """The database was made by a pre-release runyard, at a schema revision whose migration is
    gone (the pre-release migrations were squashed into the first release's one)."""


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; ``None`` for another database or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any, foreign_keys: bool = True) -> None:
    cur = dbapi_conn.cursor()
    # WAL lets the UI read while the scheduler and rank 0 write; NORMAL sync is safe under WAL
    # (a power cut can lose the last commits, never corrupt the file).
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
    cur.close()


def make_engine(url: str, foreign_keys: bool = True, pool_size: int = POOL_SIZE,
                max_overflow: int = POOL_OVERFLOW) -> Engine:
    """Create an engine for ``url``; for SQLite, create the folder and set the pragmas.

    ``foreign_keys=False`` leaves SQLite's foreign-key enforcement off on this engine's
    connections (other connections keep it, and cascading deletes from them still work). Only
    rank 0's metric writer asks for it: it inserts points under its own run and under metric
    ids it has just resolved, and checking the two keys of every point cost a tenth of the
    ingest time (docs/benchmarks-journal.md, "Metric ingest"). PostgreSQL holds no keys on the metric
    tables (the initial migration); its writer checks the run and the names once a batch instead
    (db/metricstore/bulk.py).

    ``pool_size`` and ``max_overflow`` bound the connections this engine holds on a server
    database (SQLite opens one per thread and needs no budget); no connection is opened before
    the first query.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", lambda conn, record: _sqlite_pragmas(conn, record, foreign_keys))
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=max_overflow)


def read_only_url(url: str) -> str:
    """The SQLite URL that opens ``url``'s file read-only, for a folder that cannot be written.

    A WAL database needs its ``-shm`` to be read: with a ``-wal`` that holds commits (the
    database was copied or frozen while a process had it open) both are read as they are
    (``mode=ro``); without one the file is complete and is opened ``immutable=1`` (no ``-shm``
    made, no locks taken). Other URLs are returned unchanged.

    Raises:
        DatabaseError: a ``-wal`` with commits but no ``-shm``: SQLite cannot read that read-only.
    """
    db_file = sqlite_path(url)
    if db_file is None:
        return url
    wal, shm = Path(f"{db_file}-wal"), Path(f"{db_file}-shm")
    try:
        pending = wal.stat().st_size > 0
    except OSError:
        pending = False
    if pending and not shm.exists():
        raise DatabaseError(
            f"database {db_file} is read-only and its {wal.name} holds commits but {shm.name} is missing, so "
            "SQLite cannot read it here; copy the folder somewhere writable and set RUNYARD_HOME to the copy")
    mode = "mode=ro" if pending else "mode=ro&immutable=1"
    return f"sqlite:///file:{quote(str(db_file), safe='/')}?{mode}&uri=true"


def make_read_only_engine(url: str) -> Engine:
    """An engine that only reads ``url``'s SQLite file (:func:`read_only_url`): no folder is
    made, no WAL switch is tried, and ``query_only`` refuses any write. A server database (whose
    files are not in a folder of ours) gets the usual engine; its callers only read."""
    if sqlite_path(url) is None:
        return make_engine(url)
    engine = create_engine(read_only_url(url), connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    def pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA query_only=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.close()

    event.listen(engine, "connect", pragmas)
    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _alembic_config(url: str) -> Config:
    from alembic.config import Config  # noqa: PLC0415 - Alembic only to migrate

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _record_holder(fd: int) -> None:
    """Write this process's pid into the lock file it now holds (for a waiter's timeout message)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


@contextlib.contextmanager
def _file_migration_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (filelock's native Unix lock), held for the block."""
    from filelock import FileLock, Timeout  # noqa: PLC0415 - filelock only to migrate

    lock = FileLock(path, on_acquired=_record_holder)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        logger.info("another process is migrating the database; waiting for it (%s)", path)
        try:
            lock.acquire(timeout=timeout_s, poll_interval=0.05)
        except Timeout:
            try:
                holder = path.read_text(errors="replace")[:64].strip()
            except OSError:
                holder = ""
            raise MigrationLockTimeout(
                f"waited {timeout_s:.0f} s for the migration lock {path} (held by pid {holder or 'unknown'}); "
                "if that process is stuck, stop it and try again"
            ) from None
    try:
        yield
    finally:
        lock.release()


def _pg_lock(conn: Any, url: str, timeout_s: float) -> None:
    """Take the advisory migration lock on ``conn``, waiting up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    announced = False
    while not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": PG_MIGRATE_LOCK_KEY}).scalar_one():
        if not announced:
            logger.info("another process is migrating the database; waiting for it (%s)", safe_url(url))
            announced = True
        if time.monotonic() >= deadline:
            holder = conn.execute(text(
                "SELECT string_agg(pid::text, ',') FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND (classid::bigint << 32) + objid::bigint = :k"), {"k": PG_MIGRATE_LOCK_KEY}).scalar()
            raise MigrationLockTimeout(
                f"waited {timeout_s:.0f} s for the migration lock (pg_advisory_lock {PG_MIGRATE_LOCK_KEY}) of "
                f"{safe_url(url)} (held by server pid {holder or 'unknown'}); if that process is stuck, "
                "stop it (pg_terminate_backend) and try again"
            )
        time.sleep(0.1)


@contextlib.contextmanager
def _pg_migration_lock(url: str, timeout_s: float) -> Iterator[None]:
    """``pg_advisory_lock`` on a connection of its own, held for the block. The server drops the
    lock with the connection, so a holder that dies never leaves it taken."""
    engine = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            _pg_lock(conn, url, timeout_s)
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PG_MIGRATE_LOCK_KEY})
    finally:
        engine.dispose()


@contextlib.contextmanager
def migration_lock(url: str, timeout_s: float = MIGRATE_LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the database's migration lock: one process migrates, the others wait for it.

    SQLite: an exclusive ``flock`` (filelock) on ``migrate.lock`` beside the database file
    (released by the kernel if the holder dies). PostgreSQL: ``pg_advisory_lock`` on a dedicated connection
    (released by the server if the holder dies). Other databases take no lock.

    Raises:
        MigrationLockTimeout: the lock was not free within ``timeout_s``.
    """
    if make_url(url).get_backend_name() == "postgresql":
        with _pg_migration_lock(url, timeout_s):
            yield
        return
    db_file = sqlite_path(url)
    if db_file is None:
        yield
        return
    path = db_file.parent / MIGRATE_LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with _file_migration_lock(path, timeout_s):
        yield


def safe_url(url: str) -> str:
    """The database URL with any password hidden (for messages and logs)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as given
        return url


def _pre_release_message(url: str, current: str) -> str:
    """What a database at a pre-release revision is, and what to do about it."""
    revision = f"{current}_{PRE_RELEASE_REVISIONS[current]}"
    db_file = sqlite_path(url)
    if db_file is None:
        return (f"database {safe_url(url)} was made by a pre-release runyard (schema revision {revision}), which "
                "this runyard cannot read or upgrade: point RUNYARD_DB_URL at a new, empty database (or drop and "
                "re-create this one)")
    folder = db_file.parent
    return (f"data folder {folder} was made by a pre-release runyard (schema revision {revision}), which this "
            "runyard cannot read or upgrade: start with a new data folder (set RUNYARD_HOME to an empty one), or "
            f"delete {db_file} and {folder / RUNS_DIR} to start this one afresh")


def _adopt_pre_release_head(engine: Engine, current: str | None) -> str | None:
    """Restamp a database at the pre-release head (:data:`PRE_RELEASE_HEAD`, the very schema of
    the first release) with the first release's revision; returns the revision it is now at."""
    if current != PRE_RELEASE_HEAD:
        return current
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :new WHERE version_num = :old"),
                     {"new": FIRST_RELEASE, "old": PRE_RELEASE_HEAD})
    logger.info("schema revision %s (pre-release) is the same schema as %s; restamped", PRE_RELEASE_HEAD, FIRST_RELEASE)
    return FIRST_RELEASE


def _check_known(url: str, current: str | None) -> None:
    from alembic.script import ScriptDirectory  # noqa: PLC0415 - Alembic only to migrate
    from alembic.util.exc import CommandError  # noqa: PLC0415 - Alembic only to migrate

    if current is None:
        return
    if current in PRE_RELEASE_REVISIONS:
        raise SchemaPreRelease(_pre_release_message(url, current))
    try:
        ScriptDirectory.from_config(_alembic_config(url)).get_revision(current)
    except CommandError:
        raise SchemaUnknown(
            f"database {safe_url(url)} is at schema revision {current!r}, which this runyard does not know "
            f"(its newest is {head_revision()!r}); a newer runyard wrote it: upgrade runyard"
        ) from None


def upgrade(url: str, revision: str = "head", timeout_s: float = MIGRATE_LOCK_TIMEOUT_S) -> None:
    """Apply the Alembic migrations up to ``revision`` (idempotent), under the migration lock.

    Raises:
        MigrationLockTimeout: another process held the lock longer than ``timeout_s``.
        SchemaUnknown: the database was written by a newer runyard.
        SchemaPreRelease: the database was made by a pre-release runyard (and is not at its head).
    """
    from alembic import command  # noqa: PLC0415 - Alembic only to migrate

    engine = make_engine(url)  # creates the SQLite folder
    try:
        with migration_lock(url, timeout_s):
            current = _adopt_pre_release_head(engine, current_revision(engine))
            _check_known(url, current)
            command.upgrade(_alembic_config(url), revision)
    finally:
        engine.dispose()


def ensure_schema(engine: Engine, url: str, create: bool = True, timeout_s: float = MIGRATE_LOCK_TIMEOUT_S) -> bool:
    """Bring the database to the newest schema, once across processes.

    A database already at head costs one query and no lock. Otherwise the migration lock is
    taken and the revision read again: a process that waited finds the work done. A database at
    the pre-release head (the same schema) is restamped with the first release's revision.

    Args:
        create: Whether an empty database (no schema at all) gets one; ``False`` for read-only
            commands, which must not create a database.

    Returns:
        ``False`` when there is no schema and ``create`` is ``False``; else ``True``.

    Raises:
        MigrationLockTimeout: another process held the lock longer than ``timeout_s``.
        SchemaUnknown: the database was written by a newer runyard.
        SchemaPreRelease: the database was made by a pre-release runyard (and is not at its head).
    """
    head = head_revision()
    if current_revision(engine) == head:
        return True
    from alembic import command  # noqa: PLC0415 - only to migrate: a database at head needs no Alembic

    with migration_lock(url, timeout_s):
        current = _adopt_pre_release_head(engine, current_revision(engine))
        if current is None and not create:
            return False
        if current != head:
            _check_known(url, current)
            command.upgrade(_alembic_config(url), "head")
    return True


def check_read_only_schema(engine: Engine, url: str) -> bool:
    """Whether a database opened read-only has a schema this runyard reads (never migrates).

    Returns:
        ``False`` when it has no schema at all (nothing to read); ``True`` at the newest (the
        pre-release head is the first release's schema; it is left stamped as it is).

    Raises:
        SchemaOutdated: it is at an older revision (upgrading needs a writable copy).
        SchemaUnknown: a newer runyard wrote it.
        SchemaPreRelease: a pre-release runyard made it (and it is not at that one's head).
    """
    current = current_revision(engine)
    if current is None:
        return False
    head = head_revision()
    if (FIRST_RELEASE if current == PRE_RELEASE_HEAD else current) == head:
        return True
    _check_known(url, FIRST_RELEASE if current == PRE_RELEASE_HEAD else current)
    raise SchemaOutdated(
        f"this read-only database {safe_url(url)} is at revision {current} (this runyard reads {head}); "
        "upgrade a writable copy: copy the data folder, set RUNYARD_HOME to it and run `runyard db upgrade`")


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (Alembic's ``alembic_version`` row), None with no
    schema. Plain SQL: every command reads it, and Alembic costs 0.15 s of CPU to import."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:
        raise RuntimeError(f"the database has {len(rows)} schema revisions ({', '.join(rows)}); runyard has one line "
                           "of migrations")
    return rows[0] if rows else None


# The newest migration's revision (db/migrations/versions/); tests/unit/db/test_engine_migrations.py checks it
# against Alembic's own head, so adding a migration without moving it fails there. Read here
# without Alembic, which a command at head need not import.
SCHEMA_HEAD = "r004"
FIRST_RELEASE = "r001"  # the first release's schema: the pre-release head is restamped as it, then upgraded

# The revisions of the pre-release migrations, squashed into r001_initial_schema (their files are
# in git's history before that commit). Alembic no longer knows them, so a database at one of them
# is named here rather than failing inside Alembic.
PRE_RELEASE_REVISIONS = {
    "0001": "initial_schema", "0002": "checkpoints_resume_and_fork", "0003": "failures_retries_and_supervision",
    "0004": "price_table", "0005": "metric_store", "0006": "system_metrics", "0007": "script_workloads",
    "0008": "script_checkpoint_origin", "0009": "scheduler_leases", "0010": "postgres_metric_keys",
    "0011": "executors", "0012": "alerts", "0013": "run_workspace", "0014": "attempt_phases",
}
# The last of them built exactly r001's schema on SQLite and on PostgreSQL (compared with
# SQLAlchemy's inspector, table by table, when they were squashed): a database at it is read as
# it is, and restamped r001 where it can be written.
PRE_RELEASE_HEAD = "0014"


def head_revision() -> str:
    """The schema revision this runyard writes."""
    return SCHEMA_HEAD
