"""What the Sweeps pages say of a sweep's numbers, and the curves' bound (app/sweep_data.py)."""

from __future__ import annotations

from app import sweep_data


def test_the_curves_share_a_bound_and_thinning_keeps_the_last_point() -> None:
    assert sweep_data.points_per_trial(300) * 300 <= sweep_data.CURVE_POINTS
    assert sweep_data.points_per_trial(3000) == sweep_data.MIN_CURVE_POINTS
    points = [(s, float(s)) for s in range(100)]
    thin = sweep_data.thinned(points, 10)
    assert len(thin) == 10 and thin[-1] == (99, 99.0) and thin == sorted(thin)
    assert sweep_data.thinned(points[:5], 10) == points[:5]


def test_the_budget_and_eta_in_words() -> None:
    d = {"spent": {"gpu_hours": 0.5, "usd": 0.012, "wall_hours": 1.0},
         "left": {"gpu_hours": 1.5, "usd": None, "wall_hours": None}, "eta_s": 600.0, "ended_at": None}
    assert sweep_data.spent_text(d) == "0.5 GPU-h · $0.0120 · 1h 00m"
    assert sweep_data.left_text(d) == "1.5 GPU-h"
    assert sweep_data.left_text({"left": dict.fromkeys(("gpu_hours", "usd", "wall_hours"))}) == "no limit"
    assert sweep_data.eta_words(d) == "in 10m 00s"
    assert sweep_data.eta_words({**d, "eta_s": None}) == "once a trial has ended"
    assert sweep_data.by_state_text({"PRUNED": 2, "RUNNING": 1, "SUCCEEDED": 2}) == "2 PRUNED · 2 SUCCEEDED · 1 RUNNING"
