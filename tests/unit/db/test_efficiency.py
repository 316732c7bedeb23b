"""Goodput and the checkpoint advice (db/efficiency.py): where a run's time went."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import efficiency
from db.models import Checkpoint
from db.requests import create_run
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings

pytestmark = pytest.mark.both_dbs


def test_goodput_parts_say_where_the_time_went(sessions: sessionmaker[Session], settings: Settings) -> None:
    """Two attempts: the first spent 20 s starting, its rank failed 58 s into training with half
    its work lost (torchrun exited 2 s later), then a 20 s wait; the second started in 10 s. Saves
    blocked 3 s. The failure's part is the recovery's phases (failure to the next first step,
    the second attempt's start-up included) plus the lost work."""
    with sessions() as s:
        run = create_run(s, RunConfig(), settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.add(Checkpoint(run_id=run.id, attempt=1, step=50, path="/c/step-50", bytes=1, sha256="0",
                         params_digest="0", blocked_s=3.0, total_s=4.0, created_at=130.0))
        s.flush()
        attempts: list[dict[str, Any]] = [
            {"number": 1, "started_at": 100.0, "first_step_at": 120.0, "ended_at": 180.0, "failed_at": 178.0,
             "cause": "USER_ERROR", "last_step": 100, "resume_step": None, "steps_lost": 50},
            {"number": 2, "started_at": 200.0, "first_step_at": 210.0, "ended_at": 300.0, "failed_at": None,
             "cause": None, "last_step": 300, "resume_step": 50, "steps_lost": None},
        ]
        parts = efficiency.goodput_parts(s, run, attempts, now=300.0)
    wall = 80 + 20 + 100  # the attempts, and the wait before the retry
    assert parts["startup"] == pytest.approx(20 / wall)  # the first attempt's; the second's is the recovery's
    assert parts["checkpoints"] == pytest.approx(3 / wall)
    assert parts["failures"] == pytest.approx((210 - 178 + 29) / wall)  # the recovery, and half of 58 s redone
    assert parts["other"] == pytest.approx(1 - (20 + 3 + 61) / wall)  # no step times stored: nothing productive
