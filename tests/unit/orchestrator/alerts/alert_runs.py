"""The alert engine and the delivery worker on a test's database, and the runs they watch: small
programs the scheduler's loop drives (tests/unit/orchestrator/fake_runs.py).
"""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import AlertDelivery
from db.requests import request_cancel
from db.vocabulary.settings import Settings
from orchestrator.alerts.delivery import DeliveryWorker
from orchestrator.alerts.engine import AlertEngine
from orchestrator.alerts.store import AlertStore
from orchestrator.scheduler.loop import Scheduler
from tests.unit.orchestrator.fake_runs import make_scheduler, queue, status, tick_until


def engine_and_worker(sessions: sessionmaker[Session], settings: Settings,
                      backoff_s: tuple[float, ...] = (0.1, 0.1)) -> tuple[AlertEngine, DeliveryWorker]:
    engine = AlertEngine(sessions, settings.home)
    worker = DeliveryWorker(sessions, AlertStore(settings.home), payloads=engine.payload, backoff_s=backoff_s)
    return engine, worker


def deliveries(sessions: sessionmaker[Session]) -> list[AlertDelivery]:
    with sessions() as s:
        return list(s.scalars(select(AlertDelivery).order_by(AlertDelivery.id)))


def drain(worker: DeliveryWorker, timeout: float = 15.0) -> None:
    """Send until nothing is pending (tries that fail wait out the short test backoff)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.run_due() >= 30.0:
            return
        time.sleep(0.05)
    raise AssertionError("deliveries still pending")


def running_attempt(sessions: sessionmaker[Session], settings: Settings, name: str = "long",
                    **sections: dict) -> tuple[int, Scheduler]:
    run_id = queue(sessions, settings, name, 1, **sections)
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, run_id) == "STARTING")
    return run_id, scheduler


def cancel(sessions: sessionmaker[Session], scheduler: Scheduler, run_id: int) -> None:
    with sessions() as s:
        request_cancel(s, run_id)
        s.commit()
    tick_until(scheduler, lambda: status(sessions, run_id) in ("CANCELLED", "PAUSED"))
