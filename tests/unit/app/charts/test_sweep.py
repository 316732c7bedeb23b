"""The sweep page's Altair charts (app/charts/sweep.py): valid Vega-Lite, the best value so far,
and a trial's curve read as its objective is (rank 0 or the mean, the newest attempt)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.charts import sweep as charts

TRIALS: list[dict[str, Any]] = [
    {"number": 0, "status": "SUCCEEDED", "value": 0.5, "objective": 0.5, "gpu_hours": 0.1,
     "params": {"train.lr": 1e-3, "workload.hidden": 64}},
    {"number": 1, "status": "PRUNED", "value": 0.9, "objective": None, "gpu_hours": 0.05,
     "params": {"train.lr": 1e-1, "workload.hidden": 32}},
    {"number": 2, "status": "SUCCEEDED", "value": 0.3, "objective": 0.3, "gpu_hours": 0.1,
     "params": {"train.lr": 3e-3, "workload.hidden": 128}},
]
SPACE: dict[str, dict[str, Any]] = {"train.lr": {"log_uniform": [1e-4, 1e-1], "choice": None},
                                    "workload.hidden": {"choice": [32, 64, 128]}}


def test_the_charts_are_valid_vega_lite() -> None:
    for chart in (charts.importance_chart({"train.lr": 0.8, "workload.hidden": 0.2}),
                  charts.objective_by_param_chart(TRIALS, SPACE, "eval_loss"),
                  charts.best_so_far_chart(charts.best_so_far(TRIALS, "minimize"), "eval_loss"),
                  charts.curves_chart(charts.curves_frame({0: [(10, 1.0), (20, 0.5)]}, TRIALS, "minimize"),
                                      "eval_loss", [10])):
        chart.to_dict()  # validates against the schema


def test_the_best_so_far_counts_finished_trials_only() -> None:
    frame = charts.best_so_far(TRIALS, "minimize")
    assert frame["best"].tolist() == [0.5, 0.5, 0.3]
    assert frame["gpu_hours"].tolist() == pytest.approx([0.1, 0.15, 0.25])
    assert math.isnan(frame["value"][1])  # stopped early: no objective
    assert charts.best_so_far(TRIALS, "maximize")["best"].tolist() == [0.5, 0.5, 0.5]


def test_a_curve_is_rank_0_or_the_mean_and_the_newest_attempt_wins() -> None:
    rows = [{"attempt": 1, "rank": r, "step": s, "value": v} for r, s, v in
            ((0, 10, 1.0), (1, 10, 3.0), (0, 20, 0.8), (1, 20, 1.2), (0, 30, math.nan))]
    rows += [{"attempt": 2, "rank": 0, "step": 20, "value": 0.6}, {"attempt": 2, "rank": 1, "step": 20, "value": 0.8}]
    assert charts.curve_rows(rows, "rank0") == [(10, 1.0), (20, 0.6)]
    assert charts.curve_rows(rows, "mean") == [(10, 2.0), (20, 0.7)]
