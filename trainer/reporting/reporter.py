"""The metric reporter: ranks report, they never block on the database.

The ranks' values reach rank 0 in the control collective (trainer/reporting/monitoring.py's ``Monitor``);
rank 0 hands them to a background writer thread, which inserts them in batches and updates the
attempt's progress (newest step, time) that the scheduler watches. Only rank 0's host needs the
database.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from db.states import STARTUP_PHASES, AttemptPhase
from trainer.context import RunContext

if TYPE_CHECKING:
    from sqlalchemy import Connection

logger = logging.getLogger(__name__)


# A handler writes its records on the writer's connection, inside the batch's transaction; it
# may return actions (callables) to run only after that transaction commits: deleting files the
# rows it wrote forget (retention), so a rollback never leaves a row for a folder that is gone.
PostCommit = Callable[[], None]
Handler = Callable[["Connection", list[Any]], Iterable[PostCommit] | None]

# While the database refuses writes, the metric rows queued meanwhile are kept up to this many
# (about 200 MB); past it the oldest metric rows are dropped (and an event says how many).
# Checkpoint records, events and progress are never dropped: they are few, and the scheduler's
# resume point trusts only checkpoint rows.
MAX_PENDING_ROWS = 500_000
# Between failed writes the writer waits interval x 2^failures, up to this.
MAX_RETRY_WAIT_S = 30.0
# A write that keeps failing is logged once with its traceback, then once a minute with a count.
FAILURE_LOG_EVERY_S = 60.0


class DatabaseWriter(threading.Thread):
    """Background thread that owns rank 0's database connection.

    Metric rows, events and the progress mark are built in; other kinds of record (checkpoints)
    are written by handlers registered with :meth:`register`. Everything queued within one flush
    interval is written in one transaction. A failed transaction loses nothing: its records stay
    pending, the records that arrive meanwhile join them, and the whole batch is tried again
    with a growing wait. Rows count as written only once committed (:attr:`rows_written`).

    The thread sleeps between flushes: records only join its queue, and only the first step and
    :meth:`close` wake it early. A thread woken by every record (a few a step) would take the
    GIL from the training thread a few times a step; on a busy machine the training thread then
    waits until this one is scheduled again.
    """

    def __init__(self, db_url: str, run_id: int, attempt: int, flush_interval_s: float = 1.0,
                 max_pending_rows: int = MAX_PENDING_ROWS, close_timeout_s: float = 30.0):
        super().__init__(name="runyard-db-writer", daemon=True)
        self._db_url = db_url
        self._run_id = run_id
        self._attempt = attempt
        self._interval = flush_interval_s
        self._max_rows = max_pending_rows
        self._close_timeout_s = close_timeout_s
        self._queue: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._wake = threading.Event()  # flush now: the first step (STARTING -> RUNNING), or close()
        self._first_step_queued = False
        self._handlers: dict[str, Handler] = {"event": self._write_events, "marks": self._write_marks}
        self._pending: dict[str, list[Any]] = {}
        self._progress: tuple[int | None, float, str | None] | None = None
        self._in_startup = False  # a start-up phase was queued and no step has come since
        self._failures = 0  # consecutive failed transactions
        self._failing_since: float | None = None
        self._failure_logged_at = 0.0
        self._dropped_rows = 0  # metric rows dropped at the bound, not yet reported
        self._dropped_steps: tuple[int, int] | None = None
        self.rows_written = 0
        self.rows_dropped = 0

    def register(self, kind: str, handler: Handler) -> None:
        """Write records of ``kind`` with ``handler(connection, records)`` (in this thread)."""
        self._handlers[kind] = handler

    def put(self, kind: str, record: Any) -> None:
        self._queue.put((kind, record))

    def put_rows(self, rows: list[dict[str, Any]]) -> None:
        self._queue.put(("rows", rows))

    def put_progress(self, step: int | None, phase: str | None = None) -> None:
        """The newest completed step (or None: only the phase changed)."""
        self._queue.put(("progress", (step, time.time(), phase)))
        if step is not None and not self._first_step_queued:  # news (STARTING -> RUNNING): write it now
            self._first_step_queued = True
            self._wake.set()

    def close(self, timeout_s: float = 60.0) -> None:
        """Flush everything queued and stop the thread (a failing database gets the writer's
        ``close_timeout_s`` more tries; what still could not be written is logged)."""
        self._queue.put(None)
        self._wake.set()
        self.join(timeout_s)
        if self.is_alive():
            logger.error("database writer did not finish within %.0f s; %s are not written", timeout_s,
                         self._pending_text())

    # -- collecting -----------------------------------------------------------------------

    def _drain(self, wait_s: float) -> bool:
        """Sleep ``wait_s`` (less when woken: the first step, close), then collect everything
        queued; False once close() was called."""
        self._wake.wait(wait_s)
        self._wake.clear()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False
            kind, payload = item
            if kind == "progress":
                step, at, phase = payload
                if step is None and self._progress is not None:  # keep the step already queued
                    step = self._progress[0]
                held = self._progress[2] if self._progress else None
                if phase in STARTUP_PHASES:
                    self._in_startup = True
                elif phase is None and step is not None and self._in_startup:
                    phase, self._in_startup = "", False  # the first step clears a start-up phase ("" writes NULL)
                self._progress = (step, at, phase if phase is not None else held)
            elif kind == "rows":
                rows = self._pending.setdefault("rows", [])
                rows.extend(payload)
                if len(rows) > self._max_rows:
                    self._drop_oldest(rows, len(rows) - self._max_rows)
            else:
                self._pending.setdefault(kind, []).append(payload)

    def _drop_oldest(self, rows: list[dict[str, Any]], n: int) -> None:
        """The bound is hit (the database has refused writes for long): drop the oldest metric rows."""
        steps = [r["step"] for r in rows[:n]]
        lo, hi = min(steps), max(steps)
        if self._dropped_steps is not None:
            lo, hi = min(lo, self._dropped_steps[0]), max(hi, self._dropped_steps[1])
        self._dropped_steps = (lo, hi)
        self._dropped_rows += n
        self.rows_dropped += n
        del rows[:n]

    def _has_pending(self) -> bool:
        return bool(self._pending) or self._progress is not None or bool(self._dropped_rows)

    def _pending_text(self) -> str:
        parts = [f"{len(records)} metric point(s)" if kind == "rows" else f"{len(records)} {kind} record(s)"
                 for kind, records in self._pending.items() if records]
        if self._progress is not None:
            parts.append(f"the progress mark (step {self._progress[0]})")
        return ", ".join(parts) or "no records"

    # -- writing --------------------------------------------------------------------------

    def _write_events(self, conn: Connection, events: list[dict[str, Any]]) -> None:
        from sqlalchemy import insert  # noqa: PLC0415 - on the writer thread: the other ranks never load SQLAlchemy

        from db.models import Event  # noqa: PLC0415 - on the writer thread: the other ranks never load SQLAlchemy

        for e in events:
            conn.execute(insert(Event).values(run_id=self._run_id, attempt=self._attempt, at=e["at"],
                                                         level=e["level"], kind=e["kind"], message=e["message"]))

    def _write_marks(self, conn: Connection, marks: list[dict[str, float]]) -> None:
        """Start-up phase marks (db/vocabulary/phases.py), merged into the attempt's."""
        from sqlalchemy import select, update  # noqa: PLC0415 - on the writer thread: the other ranks never load SQLAlchemy

        from db.models import Attempt  # noqa: PLC0415 - on the writer thread: the other ranks never load SQLAlchemy

        where = (Attempt.run_id == self._run_id, Attempt.number == self._attempt)
        held = conn.execute(select(Attempt.phase_marks_json).where(*where)).scalar()
        merged: dict[str, float] = json.loads(held) if held else {}
        for batch in marks:
            merged.update(batch)
        conn.execute(update(Attempt).where(*where).values(phase_marks_json=json.dumps(merged)))

    def _dropped_event(self) -> dict[str, Any] | None:
        if not self._dropped_rows:
            return None
        lo, hi = self._dropped_steps or (0, 0)
        since = f" for {time.time() - self._failing_since:.0f} s" if self._failing_since else ""
        return {"at": time.time(), "level": "error", "kind": "records_dropped",
                "message": f"records dropped: {self._dropped_rows} metric point(s) of steps {lo}-{hi} were lost: the "
                           f"database refused writes{since} and rank 0 keeps at most {self._max_rows} points "
                           "waiting; checkpoints and events were kept"}

    def _write(self, conn: Connection) -> list[PostCommit]:
        from sqlalchemy import func, update  # noqa: PLC0415 - on the writer thread: the other ranks never load SQLAlchemy

        from db.metricstore import write_points  # noqa: PLC0415 - on the writer thread: the other ranks never load SQLAlchemy
        from db.models import Attempt  # noqa: PLC0415 - on the writer thread: the other ranks never load SQLAlchemy

        rows = self._pending.get("rows")
        if rows:
            write_points(conn, rows)
        if self._progress is not None:
            step, at, phase = self._progress
            # A start-up phase alone is no sign of life for the watchdog: it judges the start-up
            # from the launch (and a script's from its output), as before the phase was reported.
            values: dict[str, Any] = {} if step is None and phase in STARTUP_PHASES else {"progress_at": at}
            if step is not None:
                values.update(last_step=step, first_step_at=func.coalesce(Attempt.first_step_at, at))
            if phase is not None:
                values["phase"] = phase or None
            conn.execute(
                update(Attempt).where(Attempt.run_id == self._run_id, Attempt.number == self._attempt).values(**values)
            )
        dropped = self._dropped_event()
        if dropped is not None:
            self._write_events(conn, [dropped])
        actions: list[PostCommit] = []
        for kind, records in self._pending.items():
            if kind == "rows":
                continue
            handler = self._handlers.get(kind)
            if handler is None:  # a programming error: say so once, do not block the rest behind it
                logger.error("no handler for %d %r record(s); they are not written", len(records), kind)
                continue
            actions.extend(handler(conn, records) or ())
        return actions

    def _flush(self, engine: Any) -> bool:
        """One transaction for everything pending; True when it committed (then post-commit
        actions run and the pending records are forgotten), False when it failed (they stay)."""
        try:
            with engine.begin() as conn:
                actions = self._write(conn)
        except Exception as exc:  # noqa: BLE001 - the database's trouble: keep everything, try later
            self._failed(exc)
            return False
        self.rows_written += len(self._pending.get("rows", []))
        self._pending, self._progress = {}, None
        self._dropped_rows, self._dropped_steps = 0, None
        if self._failures:
            logger.warning("database writes work again after %d failed transaction(s) over %.0f s", self._failures,
                           time.time() - (self._failing_since or time.time()))
        self._failures, self._failing_since = 0, None
        for action in actions:
            try:
                action()
            except Exception:
                logger.exception("after-commit action failed")
        return True

    def _failed(self, exc: BaseException) -> None:
        self._failures += 1
        now = time.time()
        if self._failing_since is None:
            self._failing_since = now
            self._failure_logged_at = now
            logger.error("database write failed; %s stay queued and are tried again", self._pending_text(),
                         exc_info=exc)
        elif now - self._failure_logged_at >= FAILURE_LOG_EVERY_S:
            self._failure_logged_at = now
            logger.error("database writes still failing (%d tries over %.0f s; %s queued): %s", self._failures,
                         now - self._failing_since, self._pending_text(), str(exc).splitlines()[0][:300])

    def _retry_wait_s(self) -> float:
        if not self._failures:
            return self._interval
        doublings: int = 2 ** min(self._failures, 10)  # int ** int is Any to the checker
        return min(MAX_RETRY_WAIT_S, self._interval * doublings)

    def run(self) -> None:
        from db.engine import make_engine  # noqa: PLC0415 - on the writer thread: the other ranks never load SQLAlchemy

        # No foreign-key checks on this connection: it writes only this run's rows, under
        # metric ids it has just resolved (db/engine.py; a tenth of the ingest time). One
        # connection at most, opened at the first write: the one a run adds to a server database.
        engine = make_engine(self._db_url, foreign_keys=False, pool_size=1, max_overflow=0)
        running = True
        try:
            while running:
                running = self._drain(self._retry_wait_s())
                if self._has_pending():
                    self._flush(engine)
            deadline = time.monotonic() + self._close_timeout_s
            while self._has_pending() and not self._flush(engine) and time.monotonic() < deadline:
                time.sleep(min(self._retry_wait_s(), max(0.0, deadline - time.monotonic())))
            if self._has_pending():
                logger.error("closing with the database still refusing writes: %s and %d dropped metric point(s) "
                             "are not written", self._pending_text(), self._dropped_rows)
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

    def _rows(self, step: int, per_rank: Iterable[tuple[int, dict[str, float]]], at: float) -> list[dict[str, Any]]:
        return [
            {
                "run_id": self.ctx.run_id,
                "attempt": self.ctx.attempt,
                "rank": rank,
                "step": step,
                "key": key,
                "value": float(value),  # NaN and Inf stay as they are (db/metricstore/)
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

    def phase(self, phase: AttemptPhase) -> None:
        """Rank 0: what the attempt does before its first step (SETUP, FIRST_STEP), shown on the
        Run page while a person waits; the first step clears it."""
        if self.writer is not None:
            self.writer.put_progress(None, phase=phase.value)

    def marks(self, marks: dict[str, float]) -> None:
        """Rank 0: when start-up phases ended (wall-clock seconds; db/vocabulary/phases.py)."""
        if self.writer is not None:
            self.writer.put("marks", dict(marks))

    def finishing(self) -> None:
        """The loop is over: the final save and the teardown may take a while, and that is not a
        hang (the watchdog then allows supervision.startup_timeout_s)."""
        if self.writer is not None:
            self.writer.put_progress(None, phase=AttemptPhase.FINISHING.value)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
