"""The delivery worker: the ``alert_deliveries`` table is the queue, one thread empties it.

The alert job (and the Test button, and ``runyard alerts test``) insert rows in state
``pending``; :class:`DeliveryWorker` sends each due row on its own thread, retries a failed send
after a growing wait (:data:`BACKOFF_S`), and records every outcome: ``delivered``, or ``failed``
with the last error once every try failed. The scheduler's tick never sends and never waits.
Rows left pending by a scheduler that stopped are sent by the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from db.models import AlertDelivery
from orchestrator.alerts import AlertsError
from orchestrator.alerts.channels import DeliveryError, Note, send
from orchestrator.alerts.store import AlertSettings, AlertStore, Channel

logger = logging.getLogger(__name__)

# Waits before the 2nd, 3rd, 4th try; after the last one fails the delivery is ``failed``.
BACKOFF_S = (5.0, 30.0, 120.0)
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
# A claimed delivery is due again after this long if its sender never recorded an outcome.
CLAIM_S = 120.0


def scrub(text: str, url: str) -> str:
    """``text`` with every secret part of ``url`` (password, path segments, query values) masked."""
    try:
        parts = urlsplit(url)
        secrets = [parts.password or "", *parts.path.split("/"), *(v for _, v in parse_qsl(parts.query))]
    except ValueError:
        return text
    for secret in sorted((s for s in secrets if len(s) > 3), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def note_of(row: AlertDelivery, payload: dict[str, Any]) -> Note:
    title = payload.get("title") or f"runyard: {row.trigger}"
    return Note(title=str(title), body=row.message, payload=payload)


class DeliveryWorker:
    """Sends pending deliveries on a thread of its own until :meth:`close`.

    Args:
        sessions: The database.
        store: Where the channels' URLs and secrets are.
        payloads: The signed webhook's JSON for a delivery row (the engine's; tests may swap it).
        backoff_s: Waits between tries (tests shorten them).
        sender: What sends one note (tests may wrap it; default :func:`channels.send`).
    """

    def __init__(self, sessions: sessionmaker[Session], store: AlertStore,
                 payloads: Callable[[Session, AlertDelivery], dict[str, Any]],
                 backoff_s: tuple[float, ...] = BACKOFF_S,
                 sender: Callable[[Channel, Note], None] = send):
        self.sessions = sessions
        self.store = store
        self.payloads = payloads
        self.backoff_s = backoff_s
        self.sender = sender
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="runyard-alerts", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """New rows were committed: look now, not at the next due time."""
        self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.run_due()
            except Exception:
                logger.exception("alert delivery failed; trying again in 10 s")
                wait = 10.0
            self._wake.wait(wait)
            self._wake.clear()

    def run_due(self, now: float | None = None) -> float:
        """Send every due pending delivery once; returns seconds until the next one is due (at most 30)."""
        now = time.time() if now is None else now
        with self.sessions() as session:
            due = session.scalars(select(AlertDelivery.id).where(
                AlertDelivery.status == PENDING, AlertDelivery.next_at <= now).order_by(AlertDelivery.id)).all()
        if due:
            settings = self.store.load()
            for delivery_id in due:
                if self._stop.is_set():
                    break
                self.deliver(delivery_id, settings)
        with self.sessions() as session:
            soonest = session.scalars(select(AlertDelivery.next_at).where(AlertDelivery.status == PENDING)
                                      .order_by(AlertDelivery.next_at).limit(1)).first()
        return 30.0 if soonest is None else min(30.0, max(0.05, soonest - time.time()))

    def deliver(self, delivery_id: int, settings: AlertSettings | None = None, now: bool = False) -> AlertDelivery:
        """One try of one delivery, its outcome committed. No transaction is open while it sends
        (a slow channel must not hold a lock that the tick waits for). ``now``: send it whether it
        is due or not (a test message, queued for no worker to pick up)."""
        settings = settings or self.store.load()
        with self.sessions() as session:
            row = session.get(AlertDelivery, delivery_id)
            if row is None or row.status != PENDING:
                raise AlertsError(f"delivery {delivery_id} is not pending")
            note = note_of(row, self.payloads(session, row))
            channel_id, tries = row.channel_id, row.tries + 1
            # Claim it (several schedulers on one database each run a worker): the one whose
            # UPDATE moves a due next_at into the future sends; a sender that dies leaves it due
            # again after CLAIM_S. "Due" is in the UPDATE itself: a worker that read the row after
            # another's claim sees that claim's next_at, which is not due.
            claim_at = time.time()
            ready = AlertDelivery.next_at == row.next_at if now else AlertDelivery.next_at <= claim_at
            claimed = session.execute(update(AlertDelivery).where(
                AlertDelivery.id == delivery_id, AlertDelivery.status == PENDING, ready)
                .values(next_at=claim_at + CLAIM_S))
            session.commit()
            if getattr(claimed, "rowcount", 1) != 1:
                session.refresh(row)
                session.expunge(row)
                return row  # another worker took it
        url = ""
        error: str | None = None
        gone = False
        try:
            channel = settings.channel(channel_id)
            url = channel.url
            self.sender(channel, note)
        except (AlertsError, OSError, ValueError) as exc:
            error = scrub(str(exc), url) if url else str(exc)
            gone = isinstance(exc, AlertsError) and not isinstance(exc, DeliveryError)  # the channel was removed
        with self.sessions() as session:
            row = session.get(AlertDelivery, delivery_id)
            if row is None:
                raise AlertsError(f"delivery {delivery_id} was deleted while it was sent")
            row.tries = tries
            if error is None:
                row.status, row.done_at, row.error = DELIVERED, time.time(), None
            elif tries > len(self.backoff_s) or gone:
                row.status, row.done_at, row.error = FAILED, time.time(), error
                logger.warning("alert delivery %d to %s failed for good after %d tries: %s", row.id, row.channel,
                               tries, error)
            else:
                row.error, row.next_at = error, time.time() + self.backoff_s[tries - 1]
                logger.info("alert delivery %d to %s failed (try %d): %s; next try in %.0f s", row.id, row.channel,
                            tries, error, self.backoff_s[tries - 1])
            session.commit()
            session.refresh(row)
            session.expunge(row)
            return row
