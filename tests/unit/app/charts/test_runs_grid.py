"""The Runs list's cells and column widths (app/charts/runs_grid.py): text a person reads, never "None"
or "nan", and widths from the content so that nothing is cut; the real grid's measurements are
tests/browser/test_runs_grid_browser.py."""

from __future__ import annotations

import math

import pandas as pd

from app.charts.runs_grid import (
    HEADER_ICON_PX,
    MAX_PX,
    MIN_PX,
    PADDING_PX,
    column_width,
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


def test_progress_is_whole_percent_rounded_down() -> None:
    assert [progress_percent(p) for p in (None, math.nan, 0.0, 0.4, 0.996, 1.0, 1.2)] == [0, 0, 0, 40, 99, 100, 100]


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
