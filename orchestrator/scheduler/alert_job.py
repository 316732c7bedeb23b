"""The scheduler's alert job: the alert engine (orchestrator/alerts/) registered beside the tick,
with its delivery thread. Here, in the scheduler's room, because it wires the two together: the
alerts package knows nothing of the scheduler."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.alerts.delivery import DeliveryWorker
from orchestrator.alerts.engine import EVERY_S, AlertEngine
from orchestrator.alerts.store import AlertStore
from orchestrator.scheduler.repeats import RepeatedErrors

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

    from db.lease import Identity
    from db.vocabulary.settings import Settings

logger = logging.getLogger("orchestrator.alerts.engine")  # the alerts' log, where their errors belong


class SchedulerLike(Protocol):
    """What the alert job needs of orchestrator.scheduler.loop.Scheduler (not imported: it imports this)."""

    sessions: sessionmaker[Session]
    settings: Settings
    host: str

    def identity(self) -> Identity | None: ...


def add_alert_jobs(aps: BaseScheduler, scheduler: SchedulerLike) -> DeliveryWorker:
    """Register the ``alerts`` job beside ``tick`` and start the delivery worker (the caller
    closes it). The job catches and logs its own errors; it never runs on the tick's thread."""
    holder: dict[str, AlertEngine] = {}
    worker = DeliveryWorker(scheduler.sessions, AlertStore(scheduler.settings.home),
                            payloads=lambda session, row: holder["engine"].payload(session, row))

    def identity() -> int | None:
        me = scheduler.identity()
        return me.id if me is not None else None

    engine = AlertEngine(scheduler.sessions, scheduler.settings.home, worker, identity=identity, host=scheduler.host)
    holder["engine"] = engine
    errors = RepeatedErrors(logger)

    def guarded() -> None:
        try:
            engine.evaluate()
        except Exception as exc:  # noqa: BLE001 - the alert job's loop boundary
            errors.failed("alerts", exc)
        else:
            errors.succeeded("alerts")

    worker.start()
    aps.add_job(guarded, "interval", seconds=EVERY_S, id="alerts", max_instances=1, coalesce=True,
                misfire_grace_time=None)
    return worker
