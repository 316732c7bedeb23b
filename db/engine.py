"""Engine and session set-up, SQLite pragmas, and schema upgrades through Alembic."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 10_000


def _sqlite_pragmas(dbapi_conn, _record, foreign_keys: bool = True) -> None:  # type: ignore[no-untyped-def]
    cur = dbapi_conn.cursor()
    # WAL lets the UI read while the scheduler and rank 0 write; NORMAL sync is safe under WAL
    # (a power cut can lose the last commits, never corrupt the file).
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
    cur.close()


def make_engine(url: str, foreign_keys: bool = True) -> Engine:
    """Create an engine for ``url``; for SQLite, create the folder and set the pragmas.

    ``foreign_keys=False`` leaves SQLite's foreign-key enforcement off on this engine's
    connections (other connections keep it, and cascading deletes from them still work). Only
    rank 0's metric writer asks for it: it inserts points under its own run and under metric
    ids it has just resolved, and checking the two keys of every point cost a tenth of the
    ingest time (BENCHMARKS.md). PostgreSQL always checks them.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", lambda conn, record: _sqlite_pragmas(conn, record, foreign_keys))
        return engine
    return create_engine(url, pool_pre_ping=True)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations up to ``revision`` (idempotent)."""
    from alembic import command

    make_engine(url).dispose()  # creates the SQLite folder
    command.upgrade(_alembic_config(url), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision(url: str) -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config(url)).get_current_head()
