"""Cost so far and ETA arithmetic."""

from __future__ import annotations

import pytest

from orchestrator.cost import cost_usd, eta_seconds, gpu_price, price_for
from orchestrator.resources import Inventory


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
    assert eta_seconds(points, 1000) == pytest.approx(80.0)


def test_eta_ignores_warm_up_before_recent_points() -> None:
    # A slow start (compile, data loading) followed by a steady 10 steps/s.
    points = [(10, 100.0)] + [(step, 200.0 + step / 10) for step in range(20, 1000, 10)]
    assert eta_seconds(points, 2000) == pytest.approx((2000 - 990) / 10)


def test_eta_unknown_without_progress() -> None:
    assert eta_seconds([], 100) is None
    assert eta_seconds([(5, 1.0)], 100) is None
    assert eta_seconds([(5, 1.0), (5, 2.0)], 100) is None
