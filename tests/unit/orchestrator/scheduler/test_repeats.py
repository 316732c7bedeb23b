"""Errors that repeat every tick (orchestrator/scheduler/repeats.py): logged once, then counted."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.exc import OperationalError

from orchestrator.scheduler.repeats import RepeatedErrors


def test_repeated_errors_are_logged_once_then_counted(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.repeats")
    errors = RepeatedErrors(log, summary_every_s=60)
    caplog.set_level(logging.INFO, logger="test.repeats")
    exc = OperationalError("UPDATE runs", {}, Exception("database or disk is full"))

    for i in range(1000):
        errors.failed("run 3", exc, now=1000.0 + i * 0.5)  # 500 s of ticks
    errors.succeeded("run 3", now=1600.0)

    lines = [r.getMessage() for r in caplog.records]
    assert sum(1 for r in caplog.records if r.exc_info) == 1
    counts = [ln for ln in lines if "the same error" in ln]
    assert 7 <= len(counts) <= 9  # one a minute
    assert "works again after failing 1000 time(s)" in lines[-1]
