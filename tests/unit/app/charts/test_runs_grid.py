"""The Runs list's cells and column widths (app/charts/runs_grid.py): text a person reads, never "None"
or "nan", and widths from the content so that nothing is cut; the real grid's measurements are
tests/browser/test_runs_grid_browser.py."""

from __future__ import annotations

import math

import pandas as pd

from app.charts.runs_grid import (
    HEADER_ICON_PX,
    LONG_COMFORT_PX,
    LONG_FLOOR_PX,
    MAX_PX,
    MIN_PX,
    PADDING_PX,
    column_width,
    fit_columns,
    fitted,
    headline_text,
    loss_text,
    progress_percent,
    shortened,
    text_px,
)


def test_cells_say_a_dash_where_there_is_nothing_never_none_or_nan() -> None:
    assert [loss_text(v) for v in (None, math.nan, math.inf, 0.0123456, 12.5)] == ["–", "–", "–", "0.01235", "12.5"]
    assert headline_text({"headline_key": None}) == "–"
    assert headline_text({"headline_key": "eval_accuracy", "headline_value": None}) == "–"
    assert headline_text({"headline_key": "eval_accuracy", "headline_value": 0.875}) == "Eval accuracy 87.5%"


def test_progress_is_percent_with_two_decimals_rounded_down() -> None:
    assert [progress_percent(p) for p in (None, math.nan, 0.0, 0.4, 0.29, 0.12345, 0.99996, 1.0, 1.2)] == [
        0, 0, 0, 40, 29, 12.34, 99.99, 100, 100]


def test_a_column_is_as_wide_as_its_longest_text_or_title() -> None:
    assert column_width("status", ["FAILED", "SUCCEEDED"]) == math.ceil(text_px("SUCCEEDED") + PADDING_PX)
    assert column_width("best loss", ["0.5"]) == math.ceil(text_px("best loss") + HEADER_ICON_PX + PADDING_PX)
    assert column_width("", [""]) == MIN_PX
    assert text_px("failed") < text_px("FAILED") < text_px("WWWWWW")


def test_a_long_text_is_shortened_on_purpose_and_the_rest_kept_whole() -> None:
    reason = "queued: waiting for 2 free GPU(s) " + "and more words " * 10
    frame = pd.DataFrame({"waiting for": [reason, ""], "status": ["QUEUED", "RUNNING"], "progress": [0.0, 40.0]})
    out, widths = fitted(frame, {})
    cell = out["waiting for"][0]
    assert cell.endswith("…") and reason.startswith(cell[:-1]) and text_px(cell) <= MAX_PX["waiting for"] - PADDING_PX
    assert MAX_PX["waiting for"] - 20 <= widths["waiting for"] <= MAX_PX["waiting for"]
    assert out["status"].tolist() == ["QUEUED", "RUNNING"]
    assert shortened("short", 100) == "short"


def test_the_shown_columns_fit_the_grid_the_long_ones_giving_way_widest_first() -> None:
    frame = pd.DataFrame({"status": ["QUEUED", "RUNNING"], "progress": [0.0, 40.0],
                          "waiting for": ["queued: waiting for 2 free GPU(s) and the run before " * 3, ""],
                          "tags": ["baseline, lr-search, digits", "a"], "name": ["a-rather-long-run-name", "b"],
                          "note": ["x" * 300, ""]})
    _, natural = fitted(frame, {}, fit_px=10_000)
    shown = ["status", "progress", "waiting for", "tags", "name"]
    assert sum(natural[c] for c in shown) > 600
    out, widths = fitted(frame, {}, shown, fit_px=600)
    assert sum(widths[c] for c in shown) <= 600
    assert widths["status"] == natural["status"] and widths["progress"] == natural["progress"]
    assert widths["waiting for"] < natural["waiting for"] and widths["waiting for"] >= LONG_FLOOR_PX
    assert widths["tags"] <= natural["tags"] and widths["name"] <= natural["name"]
    for column in ("waiting for", "tags", "name"):
        assert all(text_px(str(cell)) <= widths[column] - PADDING_PX for cell in out[column])  # shortened, not cut
    assert out["waiting for"][0].endswith("…")
    assert fitted(frame, {}, shown, fit_px=10_000)[1] == natural  # room enough: nothing gives way


def test_the_default_columns_fit_leaving_out_the_empty_ones_then_the_least_needed() -> None:
    frame = pd.DataFrame({"name": ["baseline", "steep"], "status": ["SUCCEEDED", "QUEUED"],
                          "waiting for": ["", "starts ≈ 15:40, after run 38; queued: waiting for 2 free GPU(s)"],
                          "alert": ["", ""], "energy": ["0.12 kWh", "–"], "step": ["300/300", "0/1000"],
                          "elapsed": ["5m 00s", "–"], "your cost": ["–", "–"], "progress": [100.0, 0.0]})
    shown = list(frame.columns)
    out, widths, kept, dropped = fit_columns(frame, {}, shown, fit_px=10_000)
    assert kept == [c for c in shown if c not in ("alert", "your cost")] and dropped == []  # nothing to say: out
    assert out["waiting for"][1] == frame["waiting for"][1]  # room enough: whole
    # The long texts give way down to a comfortable width first, then the least needed columns go.
    comfortable = fitted(frame, {}, kept, 1, LONG_COMFORT_PX)[1]
    room = sum(comfortable[c] for c in kept) - comfortable["energy"] + 5
    out, widths, kept, dropped = fit_columns(frame, {}, shown, fit_px=room)
    assert dropped == ["energy"] and sum(widths[c] for c in kept) <= room
    assert widths["waiting for"] >= LONG_COMFORT_PX - 10 and out["waiting for"][1].endswith("…")
    out, widths, kept, dropped = fit_columns(frame, {}, shown, fit_px=300)
    assert dropped == ["energy", "step", "elapsed"]  # all that may go went; then the long texts gave way
    assert out["waiting for"][1].endswith("…") and widths["waiting for"] >= column_width("waiting for", [])
    # The cloud reference goes last: only once the long texts are at their narrowest.
    priced = frame.assign(cost=["$0.0833", "$0.00"])
    narrowest = fit_columns(priced, {}, [*shown, "cost"], fit_px=300)[1]
    tight = sum(narrowest[c] for c in ("name", "status", "waiting for", "progress", "cost"))
    assert fit_columns(priced, {}, [*shown, "cost"], fit_px=tight)[3] == ["energy", "step", "elapsed"]
    assert fit_columns(priced, {}, [*shown, "cost"], fit_px=tight - 1)[3] == ["energy", "step", "elapsed", "cost"]
