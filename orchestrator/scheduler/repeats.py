"""Errors that repeat every tick are logged once, then counted; the same error told from another.

The scheduler's tick runs twice a second. When something keeps failing (the database cannot
grow, one run's row is corrupt) a traceback per tick buries everything else in the log (638 of
them in four minutes, once). :class:`RepeatedErrors` logs the first occurrence of an error with
its traceback, then only counts it and logs one line with the count every ``summary_every_s``,
and one line when the error stops. Two errors are the same when their lines are, volatile parts
aside (db/vocabulary/causes.py's ``normalize_exception``: temporary names, addresses, pids,
ports), which is also the retry policy's "the same exception twice" and a sweep's breaker's. What
a settle logs is logged once its commit passes (:func:`log_after_commit`), not at every tick that
tries it again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy import event as sa_event
from sqlalchemy.orm import Session

from db.vocabulary.causes import normalize_exception

SUMMARY_EVERY_S = 60.0


@dataclass
class _Seen:
    signature: str
    first_at: float
    count: int = 1  # occurrences since the last line logged about it
    total: int = 1
    logged_at: float = 0.0


def signature(exc: BaseException) -> str:
    """What makes two errors "the same": the type and the message without its volatile parts."""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {normalize_exception(first_line[:300])}"


class RepeatedErrors:
    """Log each distinct error of a place once with its traceback, then a count now and then.

    Args:
        logger: where the lines go.
        summary_every_s: how often a still-repeating error gets its one line with the count.
    """

    def __init__(self, logger: logging.Logger, summary_every_s: float = SUMMARY_EVERY_S):
        self.logger = logger
        self.summary_every_s = summary_every_s
        self._seen: dict[str, _Seen] = {}

    def failed(self, where: str, exc: BaseException, now: float | None = None) -> None:
        """``where`` (e.g. ``"tick"``, ``"run 12"``) raised ``exc``; call from the ``except`` block."""
        now = time.time() if now is None else now
        sig = signature(exc)
        seen = self._seen.get(where)
        if seen is None or seen.signature != sig:
            self._seen[where] = _Seen(sig, first_at=now, logged_at=now)
            self.logger.error("%s failed: %s; trying again at the next tick (repeats are counted, not logged)",
                              where, sig, exc_info=exc)
            return
        seen.count += 1
        seen.total += 1
        if now - seen.logged_at >= self.summary_every_s:
            self.logger.error("%s: the same error %d more time(s) in the last %.0f s (%d since %s): %s",
                              where, seen.count, now - seen.logged_at, seen.total,
                              time.strftime("%H:%M:%S", time.localtime(seen.first_at)), sig)
            seen.count, seen.logged_at = 0, now

    def succeeded(self, where: str, now: float | None = None) -> None:
        """``where`` worked again: one line if it had been failing."""
        seen = self._seen.pop(where, None)
        if seen is not None:
            now = time.time() if now is None else now
            self.logger.warning("%s works again after failing %d time(s) over %.0f s (%s)",
                                where, seen.total, now - seen.first_at, seen.signature)

    def failing(self, where: str) -> str | None:
        """The signature of the error ``where`` is failing with, or None."""
        seen = self._seen.get(where)
        return seen.signature if seen else None


_AFTER_COMMIT = "runyard.log_after_commit"


def log_after_commit(session: Session, log: logging.Logger, line: str) -> None:
    """Log ``line`` to ``log`` once the session's transaction commits, and never if it is rolled
    back: a settle that the database refused (a full disk) is made again at every tick, and its
    lines must not be logged at every tick."""
    lines: list[tuple[logging.Logger, str]] | None = session.info.get(_AFTER_COMMIT)
    if lines is None:
        lines = session.info[_AFTER_COMMIT] = []
        sa_event.listen(session, "after_commit", _log_committed)
        sa_event.listen(session, "after_rollback", lambda s: s.info[_AFTER_COMMIT].clear())
    lines.append((log, line))


def _log_committed(session: Session) -> None:
    lines: list[tuple[logging.Logger, str]] = session.info[_AFTER_COMMIT]
    for log, line in lines:
        log.info("%s", line)
    lines.clear()
