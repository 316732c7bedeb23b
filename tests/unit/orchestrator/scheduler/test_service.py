"""The scheduler as a process (orchestrator/scheduler/service.py): one per data folder."""

from __future__ import annotations

import pytest

from db.vocabulary.settings import Settings
from orchestrator.scheduler.service import SchedulerLocked, acquire_lock


def test_one_scheduler_per_data_folder(settings: Settings) -> None:
    lock = acquire_lock(settings.home)
    try:
        with pytest.raises(SchedulerLocked, match="already running"):
            acquire_lock(settings.home)
    finally:
        lock.release()
    acquire_lock(settings.home).release()  # released: the next scheduler may start
