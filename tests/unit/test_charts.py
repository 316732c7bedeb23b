"""The Run page's chart shaping (app/charts.py): EMA through NaN gaps, the rank mean with its
band, bucket min/max bands, lineage, x axes, log scale, and NaN markers.

    pytest tests/unit/test_charts.py
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from app import charts
from app.charts import ChartOptions


def bucket(attempt: int, rank: int, step: int, value: float, lo: float | None = None, hi: float | None = None,
           nan_count: int = 0, t: float | None = None, count: int = 1) -> dict:
    return {"attempt": attempt, "rank": rank, "step": step, "last_step": step + count - 1, "value": value,
            "min": value if lo is None else lo, "max": value if hi is None else hi, "last": value, "count": count,
            "nan_count": nan_count, "wall_time": 1000.0 + step if t is None else t}


def test_ema_is_identity_without_smoothing_and_debiased_with_it() -> None:
    values = pd.Series([2.0, 4.0, 8.0])
    assert charts.ema(values, 0.0).tolist() == [2.0, 4.0, 8.0]
    smooth = charts.ema(values, 0.5).tolist()
    assert smooth[0] == pytest.approx(2.0)  # debiased: the first value itself, not half of it
    assert smooth[1] == pytest.approx((4 + 0.5 * 2) / 1.5)
    assert smooth[2] == pytest.approx((8 + 0.5 * 4 + 0.25 * 2) / 1.75)


def test_ema_skips_nan_and_infinity_without_being_poisoned() -> None:
    smooth = charts.ema(pd.Series([1.0, math.nan, math.inf, 1.0, 1.0]), 0.9).tolist()
    assert smooth[0] == pytest.approx(1.0)
    assert math.isnan(smooth[1]) and math.isnan(smooth[2])  # no smoothed value where there is none
    assert smooth[3] == pytest.approx(1.0) and smooth[4] == pytest.approx(1.0)  # the gap did not poison it


def test_per_rank_frame_marks_superseded_buckets_and_nan() -> None:
    rows = [bucket(1, r, s, 1.0 + r) for r in (0, 1) for s in (0, 10, 20)]
    rows += [bucket(2, r, s, 0.5, nan_count=1 if s == 20 else 0) for r in (0, 1) for s in (10, 20)]
    frame, title = charts.series_frame(rows, {1: 10, 2: math.inf}, ChartOptions())
    assert title == "step"
    assert sorted(frame["rank"].unique()) == ["0", "1"]
    assert frame[frame["superseded"]][["attempt", "step"]].drop_duplicates().values.tolist() == [[1, 20]]
    assert frame[frame["nan"]][["attempt", "step"]].values.tolist() == [[2, 20], [2, 20]]
    assert frame["smooth"].isna().all()  # no smoothing asked


def test_rank_mean_frame_has_the_mean_and_a_band_over_every_rank_and_bucket() -> None:
    rows = [bucket(1, 0, 0, 1.0, lo=0.5, hi=4.0, count=4), bucket(1, 1, 0, 3.0, lo=2.0, hi=3.5, count=4),
            bucket(1, 0, 4, 2.0, count=4), bucket(1, 1, 4, math.nan, nan_count=4, count=4)]
    frame, _ = charts.series_frame(rows, {1: math.inf}, ChartOptions(ranks=charts.RANK_MEAN))
    assert frame["rank"].unique().tolist() == ["mean"]
    first, second = frame.iloc[0], frame.iloc[1]
    assert first["value"] == pytest.approx(2.0) and first["lo"] == 0.5 and first["hi"] == 4.0
    assert first["count"] == 8 and not first["nan"]
    assert second["value"] == pytest.approx(2.0) and second["nan"]  # the mean of what is not NaN, flagged


def test_time_axes_and_log_scale() -> None:
    rows = [bucket(1, 0, s, v, t=5000.0 + 60 * s) for s, v in ((0, 0.0), (1, 1.0), (2, 2.0), (10, 4.0))]
    wall, title = charts.series_frame(rows, {}, ChartOptions(x=charts.X_WALL))
    assert title == "wall time" and wall["x"].tolist() == [5_000_000.0, 5_060_000.0, 5_120_000.0, 5_600_000.0]
    rel, title = charts.series_frame(rows, {}, ChartOptions(x=charts.X_RELATIVE, log_y=True), started_at=4400.0)
    assert title == "time since start (min)"
    assert rel["x"].tolist() == [10.0, 11.0, 12.0, 20.0]
    assert math.isnan(rel["value"].iloc[0]) and rel["value"].iloc[1] == 1.0  # zero cannot be drawn on a log scale


def layer_marks(chart) -> list[str]:  # type: ignore[no-untyped-def]
    spec = chart.to_dict()
    return [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in spec["layer"]]


def test_metric_chart_layers_follow_the_options() -> None:
    rows = [bucket(1, r, s, 1.0, lo=0.5, hi=3.0, count=16, nan_count=1 if s == 32 else 0)
            for r in (0, 1) for s in range(0, 64, 16)]
    options = ChartOptions(smoothing=0.6)
    frame, title = charts.series_frame(rows, {}, options)
    chart = charts.metric_chart(frame, "loss", options, title, bucketed=True)
    # bucket band, faint values, strong EMA, NaN rule
    assert layer_marks(chart) == ["area", "line", "line", "rule"]
    spec = chart.to_dict()
    assert spec["title"] == "loss"
    assert spec["layer"][1]["mark"]["opacity"] < spec["layer"][2]["mark"].get("opacity", 1.0)
    raw = charts.metric_chart(charts.series_frame(rows[:2], {}, ChartOptions())[0], "loss", ChartOptions())
    assert layer_marks(raw) == ["line"]
    log = charts.metric_chart(frame, "loss", ChartOptions(log_y=True, x=charts.X_WALL), "wall time")
    assert json.dumps(log.to_dict()).count('"type": "log"') >= 1
