"""The scheduler's alert job (orchestrator/scheduler/alert_job.py): it runs beside the tick, with
the delivery worker on a thread of its own.
"""

from __future__ import annotations

import threading

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.orm import Session, sessionmaker

from db.vocabulary.settings import Settings
from orchestrator.scheduler.alert_job import add_alert_jobs
from tests.unit.orchestrator.fake_runs import make_scheduler


def test_the_alert_job_runs_beside_the_tick(sessions: sessionmaker[Session], settings: Settings) -> None:
    aps = BackgroundScheduler()
    scheduler = make_scheduler(sessions, settings)
    worker = add_alert_jobs(aps, scheduler)
    try:
        job = aps.get_job("alerts")
        assert job is not None and job.max_instances == 1 and job.coalesce
        assert any(t.name == "runyard-alerts" for t in threading.enumerate())
    finally:
        worker.close()
        scheduler.close()
