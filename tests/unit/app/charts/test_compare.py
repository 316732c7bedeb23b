"""The Compare page's chart shapes (app/charts/compare.py): the Run page's log rule, its EMA and its
x axes on several runs' lines (issue 56, item 4)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from app.charts import compare as cc
from app.charts.metric import X_RELATIVE, X_STEP, X_WALL, ema


def mean(values: list[float], start: float = 1000.0) -> pd.DataFrame:
    steps = list(range(1, len(values) + 1))
    return pd.DataFrame({"step": steps, "value": values, "wall_time": [start + 30.0 * s for s in steps]})


def test_a_loss_spanning_more_than_two_decades_opens_on_a_log_axis_a_share_never() -> None:
    falling = mean([10.0 * 0.5**i for i in range(12)])  # 10 to 0.005: more than three decades
    assert cc.log_by_rule("loss", falling)
    assert not cc.log_by_rule("loss", mean([2.0, 1.0, 0.5]))
    assert not cc.log_by_rule("eval_accuracy", mean([0.001, 0.5, 0.9]))  # a share: never log


def test_the_x_axes_are_the_steps_the_clock_and_the_time_since_each_run_started() -> None:
    m = mean([3.0, 2.0, 1.0], start=1000.0)
    assert cc.placed(m, X_STEP, None, 0.0)["x"].tolist() == [1.0, 2.0, 3.0]
    assert cc.placed(m, X_WALL, None, 0.0)["x"].tolist() == [1_030_000.0, 1_060_000.0, 1_090_000.0]
    relative = cc.placed(m, X_RELATIVE, 1000.0, 0.0)
    assert relative["x"].tolist() == [30.0, 60.0, 90.0]
    long = relative.assign(x=relative["x"] * 100)  # 9000 s: read in minutes
    frame, title = cc.relative_x(long)
    assert title == "time since start (min)" and frame["x"].tolist() == [50.0, 100.0, 150.0]


def test_smoothing_is_the_run_pages_ema_drawn_over_the_faint_values() -> None:
    m = mean([4.0, 1.0, 3.0, 0.5])
    placed = cc.placed(m, X_STEP, None, 0.6)
    assert placed["smooth"].tolist() == pytest.approx(ema(m["value"], 0.6).tolist())
    assert all(math.isnan(v) for v in cc.placed(m, X_STEP, None, 0.0)["smooth"])
    frame = placed.assign(run="#1 a (SUCCEEDED)")
    spec = cc.overlay_chart(frame, "loss", ["#1 a (SUCCEEDED)"], ["#1f77b4"], log_y=True, smoothing=True).to_dict()
    faint, strong = spec["layer"]
    assert faint["mark"]["opacity"] == 0.25 and strong["encoding"]["y"]["field"] == "smooth"
    assert strong["encoding"]["y"]["scale"]["type"] == "log"
    wall = cc.overlay_chart(frame, "loss", ["#1 a (SUCCEEDED)"], ["#1f77b4"], x_axis=X_WALL, x_title="wall time")
    assert wall.to_dict()["layer"][0]["encoding"]["x"]["type"] == "temporal"
