"""Cost so far and ETA arithmetic."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import efficiency
from db.models import Attempt, Checkpoint
from db.requests import create_run
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import (
    AttemptSpan,
    Price,
    cost_usd,
    eta_estimate,
    gpu_price,
    price_for,
    wasted_seconds,
    young_daly_interval_s,
)
from db.vocabulary.inventory import Inventory


def test_cost_sums_every_attempt_including_failed_ones() -> None:
    # A failed attempt of 30 min and a running one started 15 min ago, at $4/h.
    now = 10_000.0
    attempts = [(now - 3600, now - 1800), (now - 900, None)]
    assert cost_usd(attempts, 4.0, now=now) == pytest.approx(4.0 * 0.75)


def test_gpu_prices_follow_the_model_name() -> None:
    assert gpu_price("NVIDIA H100 80GB HBM3") == 2.99
    assert gpu_price("Some Future GPU") > 0
    inv = Inventory(kind="gpu", slots=8, gpu_names=("NVIDIA H100 80GB HBM3",) * 8)
    assert price_for(4, inv).usd_per_hour == pytest.approx(4 * 2.99)


def test_cpu_runs_pay_their_share_of_the_node() -> None:
    inv = Inventory(kind="cpu", slots=4)
    assert price_for(2, inv).usd_per_hour == pytest.approx(price_for(4, inv).usd_per_hour / 2)


def test_eta_from_steady_throughput() -> None:
    # 10 steps/s, at step 200 of 1000: 80 s left.
    points = [(step, 100.0 + step / 10) for step in range(0, 201, 10)]
    assert eta_estimate(points, 1000).seconds == pytest.approx(80.0)  # type: ignore[union-attr]


def test_eta_ignores_warm_up_before_recent_points() -> None:
    # A slow start (compile, data loading) followed by a steady 10 steps/s.
    points = [(10, 100.0)] + [(step, 200.0 + step / 10) for step in range(20, 1000, 10)]
    assert eta_estimate(points, 2000).seconds == pytest.approx((2000 - 990) / 10)  # type: ignore[union-attr]


def test_eta_unknown_without_progress() -> None:
    assert eta_estimate([], 100) is None
    assert eta_estimate([(5, 1.0)], 100) is None
    assert eta_estimate([(5, 1.0), (5, 2.0)], 100) is None


def test_wasted_is_time_after_the_last_checkpoint_plus_restarts() -> None:
    # Attempt 1: 0..100 s, checkpoint written at 70 s, then killed at 100 s: 30 s lost.
    # Attempt 2: launched at 110 s, first step at 118 s (8 s restart), succeeded at 200 s.
    attempts = [
        AttemptSpan(0.0, 100.0, 5.0, failed=True, last_checkpoint_at=70.0, after_failure=False),
        AttemptSpan(110.0, 200.0, 118.0, failed=False, last_checkpoint_at=190.0, after_failure=True),
    ]
    assert wasted_seconds(attempts) == pytest.approx(30.0 + 8.0)


def test_a_failed_attempt_without_checkpoint_wasted_all_of_its_time() -> None:
    attempts = [
        AttemptSpan(0.0, 50.0, 4.0, failed=True, last_checkpoint_at=None, after_failure=False),
        AttemptSpan(60.0, 90.0, 65.0, failed=True, last_checkpoint_at=None, after_failure=True),
        AttemptSpan(95.0, None, 99.0, failed=False, last_checkpoint_at=None, after_failure=True),
    ]
    # 50 s + 30 s (its restart included) + 4 s restart of the running one
    assert wasted_seconds(attempts, now=120.0) == pytest.approx(50.0 + 30.0 + 4.0)


def test_a_clean_run_wastes_nothing() -> None:
    assert wasted_seconds([AttemptSpan(0.0, 100.0, 5.0, False, 90.0, False)]) == 0.0


# -- Young–Daly checkpoint interval ---------------------------------------------------------


def test_young_daly_is_the_square_root_of_twice_cost_times_mtbf() -> None:
    # A 2 s save and a failure every 4 hours: sqrt(2 * 2 * 14400) = 240 s.
    assert young_daly_interval_s(2.0, 4 * 3600.0) == pytest.approx(240.0)
    assert young_daly_interval_s(0.0, 3600.0) == 0.0
    # Four times the save cost doubles the interval.
    assert young_daly_interval_s(8.0, 14400.0) == pytest.approx(2 * young_daly_interval_s(2.0, 14400.0))


@pytest.mark.parametrize(("cost", "mtbf"), [(-1.0, 10.0), (1.0, -5.0), (math.nan, 10.0), (1.0, math.inf)])
def test_young_daly_refuses_impossible_inputs_naming_them(cost: float, mtbf: float) -> None:
    with pytest.raises(ValueError, match=r"checkpoint_cost_s|mtbf_s"):
        young_daly_interval_s(cost, mtbf)


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


def test_the_eta_keeps_its_pace_through_periodic_pauses_and_gives_a_range() -> None:
    # 10 steps/s, with a 5 s evaluation every 100 steps: the newest 20 points (one pause or
    # none) would swing; the window of 60 averages the pauses in.
    points, t = [], 0.0
    for step in range(10, 1001, 10):
        t += 1.0 + (5.0 if step % 100 == 0 else 0.0)
        points.append((step, t))
    before_pause = eta_estimate(points[:-1], 2000)
    after_pause = eta_estimate(points, 2000)
    assert before_pause is not None and after_pause is not None
    assert after_pause.seconds == pytest.approx(before_pause.seconds, rel=0.1)
    assert after_pause.low < after_pause.seconds < after_pause.high
