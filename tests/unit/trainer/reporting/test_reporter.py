"""Rank 0's database writer while the database refuses writes: nothing is lost when it comes
back, rows count only once committed, the pending batch is bounded (and says so when it drops),
and retention deletes a checkpoint folder only after the commit that forgets it.

The failures are the database's real errors raised on the writer's own connection (a SQLAlchemy
event on every engine, scoped to this test's database), as a full disk raises them: SQLite's
"database or disk is full", PostgreSQL's ``DiskFull``. Runs on both databases.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine, event, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from db.models import Checkpoint, Event, MetricPoint
from db.vocabulary.config import CheckpointConfig
from db.vocabulary.settings import Settings
from tests.conftest import wait_until
from trainer.checkpoint import CheckpointHistory, CheckpointManager
from trainer.reporting.reporter import DatabaseWriter

RUN_ID, ATTEMPT = 1, 1


pytestmark = pytest.mark.both_dbs


class Outage:
    """While ``on``, every INSERT/UPDATE/DELETE on this database fails as on a full disk."""

    def __init__(self, db_url: str):
        self.database = make_url(db_url).database
        self.on = False
        self.refused = 0

    def __call__(self, conn, cursor, statement, parameters, context, executemany):
        if self.on and conn.engine.url.database == self.database and \
                statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            self.refused += 1
            if conn.dialect.name == "postgresql":
                import psycopg.errors  # noqa: PLC0415 - optional: psycopg, only on PostgreSQL

                raise psycopg.errors.DiskFull("could not extend file: No space left on device")
            raise sqlite3.OperationalError("database or disk is full")


@pytest.fixture(autouse=True)
def _run(sessions: sessionmaker[Session]) -> None:
    """Run RUN_ID's row: PostgreSQL checks the points' key to it (SQLite's writer connection does not)."""
    with sessions.begin() as s:
        s.execute(text(
            "INSERT INTO runs (id, name, status, config_json, config_hash, tags_json, max_steps, nproc, run_dir, "
            "price_usd_per_hour, price_unit, created_at, updated_at) VALUES "
            f"({RUN_ID}, 'r', 'RUNNING', '{{}}', 'h', '[]', 10, 2, '/x', 0.1, 'cpu', 1.0, 2.0)"))


@pytest.fixture
def outage(settings: Settings) -> Iterator[Outage]:
    o = Outage(settings.db_url)
    event.listen(Engine, "before_cursor_execute", o)
    yield o
    event.remove(Engine, "before_cursor_execute", o)


def _rows(steps: range) -> list[dict]:
    return [{"run_id": RUN_ID, "attempt": ATTEMPT, "rank": r, "step": s, "key": "loss", "value": 1.0 / s,
             "wall_time": time.time()} for s in steps for r in (0, 1)]


def _points(sessions: sessionmaker[Session]) -> list[tuple[int, int]]:
    with sessions() as s:
        return sorted((p.step, p.rank) for p in s.scalars(select(MetricPoint)))


def test_nothing_is_lost_while_writes_fail_and_rows_count_only_once_committed(
    settings: Settings, sessions: sessionmaker[Session], outage: Outage
) -> None:
    writer = DatabaseWriter(settings.db_url, RUN_ID, ATTEMPT, flush_interval_s=0.05)
    writer.start()
    writer.put_rows(_rows(range(1, 11)))
    wait_until(lambda: writer.rows_written == 20)

    outage.on = True
    for start in range(11, 61, 10):  # five intervals' worth arrive during the outage
        writer.put_rows(_rows(range(start, start + 10)))
        time.sleep(0.06)
    wait_until(lambda: outage.refused >= 3)
    assert writer.rows_written == 20  # failed transactions count nothing
    assert _points(sessions) == [(s, r) for s in range(1, 11) for r in (0, 1)]

    outage.on = False
    writer.put_rows(_rows(range(61, 71)))
    wait_until(lambda: writer.rows_written == 140, timeout=60)
    writer.close()
    assert _points(sessions) == [(s, r) for s in range(1, 71) for r in (0, 1)]
    assert writer.rows_dropped == 0


def test_the_pending_batch_is_bounded_and_an_event_says_what_was_dropped(
    settings: Settings, sessions: sessionmaker[Session], outage: Outage
) -> None:
    writer = DatabaseWriter(settings.db_url, RUN_ID, ATTEMPT, flush_interval_s=0.05, max_pending_rows=100)
    writer.start()
    outage.on = True
    writer.put("event", {"at": time.time(), "kind": "resume", "message": "resumed from step 0", "level": "info"})
    for start in range(1, 126, 25):  # 250 rows, steps 1-125
        writer.put_rows(_rows(range(start, start + 25)))
        time.sleep(0.03)
    wait_until(lambda: outage.refused >= 2)
    outage.on = False
    writer.close()

    points = _points(sessions)
    assert points == [(s, r) for s in range(76, 126) for r in (0, 1)]  # the newest 100 rows
    assert writer.rows_written == 100 and writer.rows_dropped == 150
    with sessions() as s:
        events = {e.kind: e for e in s.scalars(select(Event))}
    assert "resume" in events  # events are never dropped
    dropped = events["records_dropped"]
    assert dropped.level == "error"
    assert dropped.message.startswith("records dropped: 150 metric point(s) of steps 1-75 were lost")


def test_close_keeps_trying_then_says_what_it_could_not_write(
    settings: Settings, sessions: sessionmaker[Session], outage: Outage, caplog: pytest.LogCaptureFixture
) -> None:
    writer = DatabaseWriter(settings.db_url, RUN_ID, ATTEMPT, flush_interval_s=0.05, close_timeout_s=1.0)
    writer.start()
    outage.on = True
    writer.put_rows(_rows(range(1, 6)))
    started = time.monotonic()
    writer.close()

    assert 0.9 <= time.monotonic() - started < 15
    assert "closing with the database still refusing writes: 10 metric point(s)" in caplog.text
    assert writer.rows_written == 0


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((4,), float(step))}, "step": step}


def test_retention_deletes_a_folder_only_after_the_commit_that_forgets_it(
    settings: Settings, sessions: sessionmaker[Session], outage: Outage, tmp_path: Path
) -> None:
    root = tmp_path / "checkpoints"
    done: list = []
    lock = threading.Lock()

    def completed(result):
        with lock:
            done.append(result)

    manager = CheckpointManager(root, async_save=False, on_complete=completed)
    writer = DatabaseWriter(settings.db_url, RUN_ID, ATTEMPT, flush_interval_s=0.05)
    config = CheckpointConfig(keep_last=1, keep_best=0)
    CheckpointHistory(RUN_ID, ATTEMPT, config, manager).attach(writer)
    writer.start()
    manager.save(10, _state(10))
    writer.put("checkpoint", done[-1])
    wait_until(lambda: _checkpoint_rows(sessions) == [(10, False)])

    outage.on = True
    manager.save(20, _state(20))
    writer.put("checkpoint", done[-1])
    wait_until(lambda: outage.refused >= 2)
    # The transaction that would insert step 20 and mark step 10 deleted keeps failing: step
    # 10's folder must still be there (its row still says it exists).
    assert (root / "step-10").is_dir() and _checkpoint_rows(sessions) == [(10, False)]

    outage.on = False
    wait_until(lambda: _checkpoint_rows(sessions) == [(10, True), (20, False)])
    wait_until(lambda: not (root / "step-10").exists())
    writer.close()
    assert (root / "step-20").is_dir()


def _checkpoint_rows(sessions: sessionmaker[Session]) -> list[tuple[int, bool]]:
    with sessions() as s:
        return [(c.step, bool(c.deleted)) for c in s.scalars(select(Checkpoint).order_by(Checkpoint.step))]


def test_rows_written_matches_the_database(settings: Settings, sessions: sessionmaker[Session]) -> None:
    writer = DatabaseWriter(settings.db_url, RUN_ID, ATTEMPT, flush_interval_s=0.05)
    writer.start()
    writer.put_rows(_rows(range(1, 51)))
    writer.close()
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(MetricPoint)) == writer.rows_written == 100
