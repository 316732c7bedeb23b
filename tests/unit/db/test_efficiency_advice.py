"""The checkpoint advice (db/efficiency.py): Young–Daly's interval from a run's save cost, its
machine's mean time between failures and its step time, and what is missing when it cannot be
given.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import efficiency
from db.models import Attempt, Checkpoint
from db.requests import create_run
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price

NOW = 1_000_000.0


def add_run(session: Session, tmp_path: Path, every_steps: int = 100, every_seconds: float = 0.0) -> int:
    config = RunConfig.model_validate(
        {"name": "yd", "train": {"max_steps": 10_000},
         "checkpoint": {"every_steps": every_steps, "every_seconds": every_seconds}}
    )
    run = create_run(session, config, tmp_path / "runs", Price(usd_per_hour=1.0, unit="test"))
    session.flush()
    return run.id


def add_attempt(session: Session, run_id: int, number: int, start: float, end: float | None, cause: str | None = None,
                *, resume_step: int = 0, first_step_at: float | None = None, last_step: int | None = None,
                progress_at: float | None = None) -> None:
    session.add(Attempt(run_id=run_id, number=number, status="FAILED" if cause else "SUCCEEDED", dir="/nowhere",
                        started_at=start, ended_at=end, cause=cause, resume_step=resume_step,
                        first_step_at=first_step_at, last_step=last_step, progress_at=progress_at))


def add_checkpoint(session: Session, run_id: int, step: int, blocked_s: float, total_s: float, at: float) -> None:
    session.add(Checkpoint(run_id=run_id, attempt=1, step=step, path=f"/ckpt/step-{step}", bytes=1, sha256="0",
                           params_digest="0", blocked_s=blocked_s, total_s=total_s, created_at=at))


def test_checkpoint_advice_from_save_cost_mtbf_and_step_time(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    with sessions() as s:
        run = add_run(s, tmp_path, every_steps=100)
        other = add_run(s, tmp_path)
        # This run: 0.5 s per step from step 1 to step 2001 in its second attempt.
        add_attempt(s, run, 1, NOW - 20_000, NOW - 14_000, cause="SIGNAL")
        add_attempt(s, run, 2, NOW - 13_000, NOW - 1000, resume_step=0,
                    first_step_at=NOW - 12_000, last_step=2001, progress_at=NOW - 11_000)
        # Another run on this machine: a hang, a preemption (not a failure), and a cancel.
        add_attempt(s, other, 1, NOW - 40_000, NOW - 30_000, cause="HANG")
        add_attempt(s, other, 2, NOW - 30_000, NOW - 28_000, cause="PREEMPTED")
        add_attempt(s, other, 3, NOW - 28_000, NOW - 24_000)
        # Bugs and OOMs recur whatever the interval: not interruptions.
        add_attempt(s, other, 4, NOW - 24_000, NOW - 23_000, cause="USER_ERROR")
        add_attempt(s, other, 5, NOW - 23_000, NOW - 22_000, cause="CUDA_OOM")
        # Blocked 1, 2, 3 s (median 2); the whole saves took longer in the background.
        for i, blocked in enumerate([1.0, 3.0, 2.0]):
            add_checkpoint(s, run, 100 * (i + 1), blocked, blocked + 10, NOW - 5000 + i)
        s.commit()
        advice = efficiency.checkpoint_advice(s, run, now=NOW)

    device_time = 6000 + 12_000 + 10_000 + 2000 + 4000 + 1000 + 1000
    assert advice["failures"] == 2  # SIGNAL and HANG; not the preemption, the bug or the OOM
    assert advice["device_time_s"] == pytest.approx(device_time)
    assert advice["mtbf_s"] == pytest.approx(device_time / 2)
    assert advice["checkpoint_cost_s"] == pytest.approx(2.0)
    assert advice["save_total_s"] == pytest.approx(12.0)
    assert advice["step_time_s"] == pytest.approx(0.5)
    expected = math.sqrt(2 * 2.0 * device_time / 2)
    assert advice["interval_s"] == pytest.approx(expected)
    assert advice["interval_steps"] == round(expected / 0.5)
    assert advice["every_steps"] == 100 and advice["every_seconds"] == 0.0
    assert advice["missing"] == []


def test_checkpoint_advice_says_what_is_missing(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    with sessions() as s:
        run = add_run(s, tmp_path)
        add_attempt(s, run, 1, NOW - 7200, None, first_step_at=NOW - 7100)  # running, one step so far
        s.commit()
        advice = efficiency.checkpoint_advice(s, run, now=NOW)
    assert advice["interval_s"] is None and advice["interval_steps"] is None
    assert advice["mtbf_s"] is None and advice["failures"] == 0
    assert advice["device_time_s"] == pytest.approx(7200)
    missing = " | ".join(advice["missing"])
    assert "no checkpoint written yet" in missing
    assert "no interruption seen on this machine yet (2.0 h of attempts)" in missing
    assert "not enough steps yet" in missing


def test_checkpoint_advice_without_step_time_still_gives_seconds(sessions: sessionmaker[Session],
                                                                  tmp_path: Path) -> None:
    with sessions() as s:
        run = add_run(s, tmp_path)
        add_attempt(s, run, 1, NOW - 3600, NOW, cause="COMM")
        add_checkpoint(s, run, 100, 0.5, 3.0, NOW - 100)
        s.commit()
        advice = efficiency.checkpoint_advice(s, run, now=NOW)
    assert advice["interval_s"] == pytest.approx(math.sqrt(2 * 0.5 * 3600))
    assert advice["interval_steps"] is None
    assert advice["missing"] == ["not enough steps yet to measure the step time"]
