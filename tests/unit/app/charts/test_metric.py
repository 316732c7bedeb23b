"""A metric's chart (app/charts/metric.py): EMA through NaN gaps, the rank mean with its band,
bucket min/max bands, lineage, x axes, log scale, and NaN markers; the rank palette, the
isolation of ranks, the hover read-out, identical ranks, and the registry's titles and units;
which layers a chart has is test_layers.py's.
"""

from __future__ import annotations

import colorsys
import json
import math

import altair as alt
import pandas as pd
import pytest

from app.charts import layers as chart_layers
from app.charts import metric as charts
from app.charts.metric import ChartOptions


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
    rel, title = charts.series_frame(rows, {}, ChartOptions(x=charts.X_RELATIVE), started_at=4400.0, log_y=True)
    assert title == "time since start (min)"
    assert rel["x"].tolist() == [10.0, 11.0, 12.0, 20.0]
    assert math.isnan(rel["value"].iloc[0]) and rel["value"].iloc[1] == 1.0  # zero cannot be drawn on a log scale


def layer_marks(chart) -> list[str]:
    spec = chart.to_dict()
    return [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in spec["layer"]]


def test_metric_chart_layers_follow_the_options() -> None:
    rows = [bucket(1, r, s, 1.0, lo=0.5, hi=3.0, count=16, nan_count=1 if s == 32 else 0)
            for r in (0, 1) for s in range(0, 64, 16)]
    options = ChartOptions(smoothing=0.6)
    frame, title = charts.series_frame(rows, {}, options)
    chart = charts.metric_chart(frame, "loss", options, title, bucketed=True)
    # bucket band, faint values, strong EMA, NaN rule, hover rule
    assert layer_marks(chart) == ["area", "line", "line", "rule", "rule"]
    spec = chart.to_dict()
    assert spec["title"] == {"text": "Loss", "subtitle": "ranks 0, 1 identical (one line)"}  # both ranks log 1.0
    assert spec["layer"][1]["mark"]["opacity"] < spec["layer"][2]["mark"].get("opacity", 1.0)
    raw = charts.metric_chart(charts.series_frame(rows[:2], {}, ChartOptions())[0], "loss", ChartOptions())
    assert layer_marks(raw) == ["line", "rule"]  # the line and the hover read-out
    log = charts.metric_chart(frame, "loss", ChartOptions(log_keys=frozenset({"loss"}), x=charts.X_WALL), "wall time")
    assert json.dumps(log.to_dict()).count('"type": "log"') >= 1


def test_the_page_draws_the_spec_these_tests_validate_without_validating_it_again() -> None:
    """The UI hands Streamlit ``charts.unvalidated(chart)``, whose ``to_dict`` (what Streamlit
    calls on every redraw) skips Altair's JSON-schema validation: the same spec as the validated
    one these tests read, and a spec that would not validate goes through (so the skip is real)."""
    chart = charts.metric_view(eight_ranks(), {}, ChartOptions(), "loss")
    validated = chart.to_dict()
    assert charts.unvalidated(chart).to_dict() == validated
    assert "to_dict" not in json.dumps(validated)  # nothing of the wrapper leaked into the spec
    broken = alt.Chart(pd.DataFrame({"x": [1, 2]}), width="wide")  # type: ignore[arg-type]  # invalid on purpose
    broken = broken.mark_line().encode(x="x:Q")
    with pytest.raises(alt.utils.schemapi.SchemaValidationError):
        broken.to_dict()
    assert charts.unvalidated(broken).to_dict()["width"] == "wide"


def eight_ranks(key: str = "loss", steps: int = 20) -> list[dict]:
    """8 ranks; ranks 5 and 6 log exactly the same values."""
    return [bucket(1, r, s, 0.01 * s * (1 + (5 if r == 6 else r) / 10)) for r in range(8) for s in range(1, steps + 1)]


def test_palette_gives_eight_ranks_eight_strong_distinct_hues() -> None:
    colors = [charts.rank_color(str(r)) for r in range(8)]
    assert len(set(colors)) == 8 and charts.MEAN_COLOR not in colors
    rgb = [tuple(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)) for c in colors]
    for r, g, b in rgb:  # strong: no pale colour (rank 7 was a pale yellow) on a white page
        lightness = colorsys.rgb_to_hls(r, g, b)[1]
        assert lightness < 0.75, (r, g, b)
    assert charts.rank_color("12") == charts.rank_color("0")  # past the palette the hues repeat
    scale = charts.rank_scale(["10", "2", "0"]).to_dict()
    assert scale["domain"] == ["0", "2", "10"] and scale["range"][1] == charts.rank_color("2")


def test_eight_ranks_default_to_the_mean_with_its_band() -> None:
    assert charts.default_rank_mode(2) == charts.PER_RANK
    assert charts.default_rank_mode(7) == charts.PER_RANK
    assert charts.default_rank_mode(8) == charts.RANK_MEAN and charts.default_rank_mode(64) == charts.RANK_MEAN


def test_hover_read_out_has_every_rank_at_each_step() -> None:
    options = ChartOptions(ranks=charts.RANK_MEAN)
    chart = charts.metric_view(eight_ranks(), {}, options, "loss").to_dict()
    params = {p["name"]: p for p in chart["params"]}
    assert set(params) == {"hover", "zoom", "box", "pin"}  # pin: the shared cursor
    hover = next(layer for layer in chart["layer"] if layer.get("name") in params["hover"]["views"])
    assert hover["mark"]["type"] == "rule" and params["hover"]["select"]["nearest"]
    zoom = params["zoom"]
    assert zoom["bind"] == "scales" and zoom["select"]["encodings"] == ["x"]
    titles = [t["title"] for t in hover["encoding"]["tooltip"]]
    assert titles == ["step", "mean", "min", "max", *[f"rank {r}" for r in range(8)]]
    wide = charts.hover_frame(charts.series_frame(eight_ranks(), {}, ChartOptions())[0])
    at_10 = wide[wide["step"] == 10].iloc[0]
    assert at_10["r3"] == pytest.approx(0.1 * 1.3) and at_10["r6"] == at_10["r5"]
    assert len(wide) == 20  # one row per step, not per rank


def test_isolated_rank_is_strong_and_the_others_faint() -> None:
    spec = charts.metric_view(eight_ranks(), {}, ChartOptions(isolated=("3",)), "loss").to_dict()
    lines = [layer for layer in spec["layer"] if layer["mark"]["type"] == "line"]
    faint, strong = lines
    assert faint["mark"]["opacity"] == chart_layers.FADED_OPACITY
    datasets = spec["datasets"]
    assert {row["rank"] for row in datasets[strong["data"]["name"]]} == {"3"}
    assert {row["rank"] for row in datasets[faint["data"]["name"]]} == {"0", "1", "2", "4", "5", "6", "7"}
    mean = charts.metric_view(eight_ranks(), {}, ChartOptions(ranks=charts.RANK_MEAN, isolated=("3",)), "loss")
    mean_spec = mean.to_dict()
    picked = [layer for layer in mean_spec["layer"] if layer["mark"]["type"] == "line"][-1]
    assert {row["rank"] for row in mean_spec["datasets"][picked["data"]["name"]]} == {"3"}  # over the mean


def test_identical_ranks_are_named_in_the_subtitle() -> None:
    frame, _ = charts.series_frame(eight_ranks(), {}, ChartOptions())
    assert charts.identical_ranks(frame) == [["5", "6"]]
    spec = charts.metric_view(eight_ranks(), {}, ChartOptions(), "loss").to_dict()
    assert spec["title"]["subtitle"] == "ranks 5, 6 identical (one line)"


def test_titles_units_and_log_scale_come_from_the_registry() -> None:
    rows = [bucket(1, r, s, 0.025) for r in (0, 1) for s in (1, 2, 3)]
    spec = charts.metric_view(rows, {}, ChartOptions(log_keys=frozenset({"step_time", "eval_accuracy"})),
                              "step_time").to_dict()
    text = json.dumps(spec)
    assert '"title": "Step time (ms), log scale"' in text and '"type": "log"' in text
    values = {round(row["value"], 9) for data in spec["datasets"].values() for row in data if "value" in row}
    assert values == {25.0}  # seconds shown in milliseconds
    accuracy = charts.metric_view(rows, {}, ChartOptions(log_keys=frozenset({"eval_accuracy"})), "eval_accuracy")
    text = json.dumps(accuracy.to_dict())
    assert '"type": "log"' not in text and '"title": "Eval accuracy (%)"' in text  # never forced onto log
    lr = json.dumps(charts.metric_view(rows, {}, ChartOptions(), "lr").to_dict())
    assert '"format": "~e"' in lr  # 1e-3 style axis labels
    unknown = json.dumps(charts.metric_view(rows, {}, ChartOptions(), "my/metric").to_dict())
    assert '"title": "my/metric"' in unknown


def test_rank_legend_isolates_through_a_click_selection_its_labels_included() -> None:
    spec = charts.rank_legend([str(r) for r in range(8)]).to_dict()
    (param,) = spec["params"]
    assert param["name"] == "isolate" and param["select"]["fields"] == ["rank"] and param["select"]["on"] == "click"
    buttons, labels = spec["layer"]
    assert buttons["encoding"]["color"]["scale"]["range"] == [charts.rank_color(str(r)) for r in range(8)]
    assert buttons["mark"]["cursor"] == "pointer"
    # The label sits on its button, its datum the rank's (issue 29: clicks on axis labels did nothing).
    assert labels["mark"]["type"] == "text" and labels["encoding"]["text"]["field"] == "label"
    assert labels["encoding"]["x"] == buttons["encoding"]["x"] and "data" not in labels  # the strip's rows


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two ``#rrggbb`` colours."""
    def luminance(c: str) -> float:
        rgb = [int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_every_rank_hue_and_the_mean_read_on_the_light_and_the_dark_theme() -> None:
    """Issue 29, item 12: Streamlit's light background (white) and dark one (#0e1117)."""
    for color in (*charts.PALETTE, charts.MEAN_COLOR):
        for background in ("#ffffff", "#0e1117"):
            assert contrast(color, background) >= 2.2, (color, background)


def test_a_metric_spanning_more_than_two_decades_opens_on_a_log_axis() -> None:
    """Issue 29, item 6: a live loss from 10 to 0.01 was a flat line after its first steps."""
    wide = [bucket(1, 0, s, 10.0 / s) for s in range(1, 2001, 10)]  # 10 down to ~0.005
    narrow = [bucket(1, 0, s, 2.0 + 1.0 / s) for s in range(1, 2001, 10)]
    share = [bucket(1, 0, s, 0.001 * s) for s in range(1, 2001, 10)]  # an accuracy is never on a log axis
    assert charts.spans_decades(wide) and not charts.spans_decades(narrow)
    assert not charts.spans_decades([bucket(1, 0, 1, 0.0), bucket(1, 0, 2, -5.0), bucket(1, 0, 3, 1.0)])
    assert charts.auto_log_keys({"loss": wide, "eval_loss": narrow, "eval_accuracy": share}) == {"loss"}


def test_a_box_zooms_its_chart_to_the_box_and_the_others_to_its_x_range_with_y_fitted() -> None:
    """Issue 29, item 6: the box drawn on one chart (Vega-Lite's interval selection on x and
    value) zooms every chart of the section; the others fit y to what lies in the x range."""
    zoom = charts.Zoom.from_selection({"x": [500, 100], "value": [0.2, 0.9]}, "loss", charts.X_STEP)
    assert zoom == charts.Zoom((100.0, 500.0), (0.2, 0.9), "loss", charts.X_STEP)
    assert charts.Zoom.from_selection({}, "loss", charts.X_STEP) is None  # a double-click cleared it
    options = ChartOptions(zoom=zoom)
    rows = [bucket(1, r, s, 1000.0 / s + r) for r in (0, 1) for s in range(1, 1001)]

    def scales(key: str) -> tuple[list[float], list[float]]:
        spec = charts.metric_view(rows, {}, options, key).to_dict()
        (box,) = [p for p in spec["params"] if p["name"] == "box"]
        assert box["select"]["encodings"] == ["x", "y"]
        line = next(layer for layer in spec["layer"] if layer.get("name") in box["views"])  # the layer with the box
        return line["encoding"]["x"]["scale"]["domain"], line["encoding"]["y"]["scale"]["domain"]

    x, y = scales("loss")
    assert x == [100.0, 500.0] and y == [0.2, 0.9]  # the box itself
    x, y = scales("step_time")
    assert x == [100.0, 500.0]
    inside = [1000.0 / s + r for r in (0, 1) for s in range(100, 501)]
    # step_time is shown in ms (x1000): y spans what lies between steps 100 and 500, with room
    assert y[0] < min(inside) * 1000 < max(inside) * 1000 < y[1] and y[1] - y[0] < (max(inside) - min(inside)) * 1200
    wall = charts.metric_view(rows, {}, ChartOptions(zoom=zoom, x=charts.X_WALL), "loss").to_dict()
    assert "domain" not in json.dumps(wall["layer"][0]["encoding"]["x"])  # a box on steps means nothing on time


def test_a_clicked_step_is_marked_on_every_chart_at_its_own_nearest_step() -> None:
    """Issue 29, item 6: the shared cursor. A click selects the nearest step (the ``pin`` point
    selection on ``step``); every chart of the section then draws a rule in the cursor colour and
    a dot on each line at its own step nearest it (an eval metric logged every 50 steps is marked
    at 150 for a click at 163), in the metric's displayed unit."""
    loss = [bucket(1, r, s, 2.0 - 0.001 * s + r) for r in (0, 1) for s in range(1, 301)]
    evals = [bucket(1, r, s, 0.01 * s) for r in (0, 1) for s in range(50, 301, 50)]
    options = ChartOptions(cursor=163)

    def marked(rows: list[dict], key: str) -> tuple[list[dict], list[dict]]:
        spec = charts.metric_view(rows, {}, options, key).to_dict()
        (pin,) = [p for p in spec["params"] if p["name"] == "pin"]
        assert pin["select"] == {"type": "point", "fields": ["step"], "on": chart_layers.PIN_CLICK, "clear": False,
                                 "nearest": True}
        rules = [layer for layer in spec["layer"]
                 if layer["mark"].get("type") == "rule" and layer["mark"].get("color") == chart_layers.CURSOR_COLOR]
        dots = [layer for layer in spec["layer"] if layer["mark"].get("type") == "circle"]
        assert len(rules) == 1 and len(dots) == 1
        datasets = spec["datasets"]
        return datasets[rules[0]["data"]["name"]], datasets[dots[0]["data"]["name"]]

    rule, dots = marked(loss, "loss")
    assert [r["step"] for r in rule] == [163]
    assert sorted((d["rank"], d["step"]) for d in dots) == [("0", 163), ("1", 163)]
    assert {d["rank"]: d["value"] for d in dots} == pytest.approx({"0": 2.0 - 0.163, "1": 3.0 - 0.163})
    rule, dots = marked(evals, "step_time")  # displayed in ms
    assert [r["step"] for r in rule] == [150] and [d["value"] for d in dots] == pytest.approx([1500.0, 1500.0])
    unmarked = charts.metric_view(loss, {}, ChartOptions(), "loss").to_dict()
    assert not [layer for layer in unmarked["layer"] if layer["mark"].get("type") == "circle"]
    assert charts.nearest_step(pd.Series([], dtype=int), 5) is None


def test_a_single_point_has_round_ticks_around_it_not_one_at_its_value() -> None:
    """Issue 56, item 6: one point (a first evaluation) drew a single tick "97.214485"; its axes
    now span a little on each side, made nice by Vega (round ticks), the point in the middle."""
    spec = charts.metric_view([bucket(1, 0, 100, 0.97214485)], {}, ChartOptions(), "eval_accuracy").to_dict()
    line = spec["layer"][0]["encoding"]
    (y0, y1), (x0, x1) = line["y"]["scale"]["domain"], line["x"]["scale"]["domain"]
    assert y0 < 97.214485 < y1 and line["y"]["scale"]["nice"] is True  # shown as a percentage
    assert x0 < 100 < x1 and line["x"]["scale"]["nice"] is True
    many = charts.metric_view([bucket(1, 0, s, 1.0 / s) for s in range(1, 20)], {}, ChartOptions(), "loss").to_dict()
    encoding = many["layer"][0]["encoding"]
    assert encoding["x"]["scale"] == encoding["y"]["scale"] == {"zero": False}  # Vega's own fit otherwise


def test_the_attempts_timeline_legend_names_only_the_outcomes_its_bars_have() -> None:
    frame = pd.DataFrame({"attempt": [1, 2], "outcome": ["FAILED", "SUCCEEDED"], "cause": ["USER_ERROR", ""],
                          "start": pd.to_datetime([0, 60], unit="s"), "end": pd.to_datetime([50, 120], unit="s"),
                          "steps": ["0–10", "10–20"], "reason": ["boom", ""]})
    scale = charts.attempt_timeline(frame).to_dict()["encoding"]["color"]["scale"]
    assert scale == {"domain": ["SUCCEEDED", "FAILED"], "range": ["#2ca02c", "#d62728"]}  # each keeps its colour
