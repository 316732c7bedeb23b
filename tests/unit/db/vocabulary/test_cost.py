"""Cost so far, waste and ETA arithmetic (db/vocabulary/cost.py): the prices, what failed
attempts cost, Young–Daly's interval, and an ETA that keeps its pace through pauses.
"""

from __future__ import annotations

import math

import pytest

from db.vocabulary.cost import (
    AttemptSpan,
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
