"""The metric reporter: ranks report, they never block on the database.

The ranks' values reach rank 0 in the control collective (trainer/monitoring.py's ``Monitor``);
rank 0 hands them to a background writer thread, which inserts them in batches and updates the
attempt's progress (newest step, time) that the scheduler watches. Only rank 0's host needs the
database.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection

from trainer.context import RunContext

logger = logging.getLogger(__name__)


Handler = Callable[[Connection, list[Any]], None]


class DatabaseWriter(threading.Thread):
    """Background thread that owns rank 0's database connection.

    Metric rows and the progress mark are built in; other kinds of record (checkpoints, events)
    are written by handlers registered with :meth:`register`. Everything queued within one flush
    interval is written in one transaction; a failed write is retried at the next interval.
    """

    def __init__(self, db_url: str, run_id: int, attempt: int, flush_interval_s: float = 1.0):
        super().__init__(name="runyard-db-writer", daemon=True)
        self._db_url = db_url
        self._run_id = run_id
        self._attempt = attempt
        self._interval = flush_interval_s
        self._queue: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._handlers: dict[str, Handler] = {}
        self._pending: dict[str, list[Any]] = {}
        self._progress: tuple[int | None, float, str | None] | None = None
        self._first_step_written = False
        self.rows_written = 0

    def register(self, kind: str, handler: Handler) -> None:
        """Write records of ``kind`` with ``handler(connection, records)`` (in this thread)."""
        self._handlers[kind] = handler

    def put(self, kind: str, record: Any) -> None:
        self._queue.put((kind, record))

    def put_rows(self, rows: list[dict]) -> None:
        self._queue.put(("rows", rows))

    def put_progress(self, step: int | None, phase: str | None = None) -> None:
        """The newest completed step (or None: only the phase changed)."""
        self._queue.put(("progress", (step, time.time(), phase)))

    def close(self, timeout_s: float = 60.0) -> None:
        """Flush everything queued and stop the thread."""
        self._queue.put(None)
        self.join(timeout_s)
        if self.is_alive():
            logger.warning("database writer did not finish within %.0f s; some records are lost", timeout_s)

    def _drain(self) -> bool:
        """Collect what arrives within one interval; False once close() was called."""
        deadline = time.monotonic() + self._interval
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return True
            if item is None:
                return False
            kind, payload = item
            if kind == "progress":
                step, at, phase = payload
                if step is None and self._progress is not None:  # keep the step already queued
                    step = self._progress[0]
                self._progress = (step, at, phase or (self._progress[2] if self._progress else None))
                if not self._first_step_written and step is not None:
                    return True  # the first step is news (STARTING -> RUNNING): write it now
            elif kind == "rows":
                self._pending.setdefault("rows", []).extend(payload)
            else:
                self._pending.setdefault(kind, []).append(payload)

    def _write(self, conn: Connection) -> None:
        from sqlalchemy import func, update

        from db.metricstore import write_points
        from db.models import Attempt

        rows = self._pending.get("rows")
        if rows:
            write_points(conn, rows)
        if self._progress is not None:
            step, at, phase = self._progress
            values: dict[str, Any] = {"progress_at": at}
            if step is not None:
                values.update(last_step=step, first_step_at=func.coalesce(Attempt.first_step_at, at))
            if phase is not None:
                values["phase"] = phase
            conn.execute(
                update(Attempt).where(Attempt.run_id == self._run_id, Attempt.number == self._attempt).values(**values)
            )
        for kind, records in self._pending.items():
            if kind != "rows":
                self._handlers[kind](conn, records)

    def run(self) -> None:
        from db.engine import make_engine

        # No foreign-key checks on this connection: it writes only this run's rows, under
        # metric ids it has just resolved (db/engine.py; a tenth of the ingest time).
        engine = make_engine(self._db_url, foreign_keys=False)
        running = True
        try:
            while running:
                running = self._drain()
                if not self._pending and self._progress is None:
                    continue
                for attempt in range(1, 6):
                    try:
                        with engine.begin() as conn:
                            self._write(conn)
                        break
                    except Exception:  # keep the records and try again
                        logger.exception("database write failed (try %d)", attempt)
                        time.sleep(self._interval * attempt)
                self.rows_written += len(self._pending.get("rows", []))
                self._first_step_written |= self._progress is not None and self._progress[0] is not None
                self._pending, self._progress = {}, None
        finally:
            engine.dispose()


class MetricReporter:
    """Per-rank metrics gathered to rank 0 and written off the training thread.

    Args:
        ctx: where this process belongs; when it is not managed by runyard nothing is written.
        rank: this process's global rank.
        world_size: number of ranks.
    """

    def __init__(self, ctx: RunContext, rank: int, world_size: int):
        self.ctx = ctx
        self.rank = rank
        self.world_size = world_size
        self.writer: DatabaseWriter | None = None
        if rank == 0 and ctx.managed:
            assert ctx.db_url is not None and ctx.run_id is not None
            self.writer = DatabaseWriter(ctx.db_url, ctx.run_id, ctx.attempt)
            self.writer.start()

    def _rows(self, step: int, per_rank: Iterable[tuple[int, dict[str, float]]], at: float) -> list[dict]:
        return [
            {
                "run_id": self.ctx.run_id,
                "attempt": self.ctx.attempt,
                "rank": rank,
                "step": step,
                "key": key,
                "value": float(value),  # NaN and Inf stay as they are (db/metricstore.py)
                "wall_time": at,
            }
            for rank, values in per_rank
            for key, value in values.items()
        ]

    def write(self, step: int, per_rank: dict[int, dict[str, float]], at: float) -> None:
        """Rank 0: queue every rank's values of ``step``, measured at wall time ``at``."""
        if self.writer is not None:
            self.writer.put_rows(self._rows(step, per_rank.items(), at))

    def log_main(self, step: int, **metrics: float) -> None:
        """Rank 0 only: values that are already global (for example eval accuracy)."""
        if self.rank == 0 and self.writer is not None:
            self.writer.put_rows(self._rows(step, [(0, metrics)], time.time()))

    def progress(self, step: int) -> None:
        """Cheap: rank 0 notes the newest completed step (heartbeat and ETA)."""
        if self.writer is not None:
            self.writer.put_progress(step)

    def finishing(self) -> None:
        """The loop is over: the final save and the teardown may take a while, and that is not a
        hang (the watchdog then allows supervision.startup_timeout_s)."""
        if self.writer is not None:
            self.writer.put_progress(None, phase="finishing")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
