"""The Runs list's grid: each column's cells as text a person reads (never "None" or "nan"), and
each column's width from its content, so that no cell is cut ("failec", "queued: wai", a best
loss without its leading digit) and the grid fits the page at 1280 px.

The grid (Glide Data Grid) draws on a canvas and clips a cell's text at the column's edge, with
no ellipsis and no tooltip: a width is given to every column from the longest text it shows,
measured with :func:`text_px` (the grid's 14 px sans-serif, a little wide on purpose), and the
few texts that may run long (why a run waits, its tags) are shortened here on purpose with "…"
at the column's widest (the Run page and `runyard show` say them whole).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from db.vocabulary import metric_registry

NONE = "–"  # a cell with nothing to say
# Pixels per character of the grid's 14 px sans-serif (Source Sans), by kind: wide letters,
# digits and capitals, narrow ones, the rest. Slightly over the font's own advances so that a
# width from them never cuts (tests/browser/test_runs_grid_browser.py measures the real text).
WIDE, CAPITAL, DIGIT, NARROW, OTHER = 12.5, 9.2, 7.6, 4.2, 7.4
WIDE_CHARS, NARROW_CHARS = set("mwMW@%"), set("iljtfrI.,:;'|!()[] ")
PADDING_PX = 20  # the grid's cell padding, both sides, and a margin
MIN_PX = 44  # a column no narrower than this
HEADER_ICON_PX = 18  # beside a header's title: the column menu's icon the grid shows on hover
# The widest each column gets; a longer text is shortened with "…" (LONG columns) or cannot be
# longer (the others' texts are bounded: a status word, a price, a step count).
MAX_PX: dict[str, int] = {"name": 220, "waiting for": 460, "tags": 200, "note": 240, "sweep": 200, "headline": 190,
                          "alert": 160, "ends at": 190, "where": 160}
LONG = ("waiting for", "tags", "note", "name", "sweep", "headline", "alert", "where")
PROGRESS_PX = 110  # a progress bar and its "100%"


def text_px(text: str) -> float:
    """The width ``text`` takes in the grid's cells, a little over the real one."""
    def px(c: str) -> float:
        if c in WIDE_CHARS:
            return WIDE
        if c in NARROW_CHARS:
            return NARROW
        if c.isdigit():
            return DIGIT
        if c.isupper():
            return CAPITAL
        return OTHER if c.isascii() else WIDE  # "≈", "–", "…", "★": as wide as a wide letter at most

    return sum(px(c) for c in text)


def shortened(text: str, max_px: float) -> str:
    """``text``, or its start and "…" where it would be wider than ``max_px``."""
    if text_px(text) <= max_px:
        return text
    while text and text_px(text + "…") > max_px:
        text = text[:-1]
    return text.rstrip(" ,;:") + "…"


def column_width(title: str, texts: Iterable[str], max_px: int | None = None) -> int:
    """A column's width in pixels: its longest text or its title (with room for the header's
    menu icon), with the cell's padding."""
    widest = max([text_px(title) + HEADER_ICON_PX, *(text_px(t) for t in texts)])
    width = math.ceil(widest + PADDING_PX)
    return max(MIN_PX, width if max_px is None else min(width, max_px))


def fitted(frame: pd.DataFrame, titles: Mapping[str, str]) -> tuple[pd.DataFrame, dict[str, int]]:
    """The frame with its long texts shortened to their column's widest, and each text column's
    width (``titles``: the header each column shows, when not its name)."""
    widths: dict[str, int] = {}
    out = frame.copy()
    for column in frame.columns:
        limit = MAX_PX.get(column)
        if column in LONG and limit is not None:
            out[column] = [shortened(str(t), limit - PADDING_PX) for t in frame[column]]
        # A link column shows its run's id (display_text), not the address it holds.
        shown = (str(t).rpartition("=")[2] for t in out[column]) if column == "run" else (str(t) for t in out[column])
        widths[column] = column_width(titles.get(column, column), shown, limit)
    widths["progress"] = PROGRESS_PX
    return out, widths


def loss_text(value: float | None) -> str:
    """A best loss as the list shows it: four significant digits, "–" without one."""
    return NONE if value is None or not math.isfinite(value) else f"{value:.4g}"


def progress_percent(progress: float | None) -> float:
    """A run's progress in whole percent, rounded down (a run at 99.6% is not done): 0 without one."""
    if progress is None or not math.isfinite(progress):
        return 0.0
    return float(math.floor(max(0.0, min(1.0, progress)) * 100))


def headline_text(r: Mapping[str, Any]) -> str:
    """The run's headline metric as the Run page labels it: "Eval accuracy 98.3%"; "–" without one."""
    key = r.get("headline_key")
    if key is None or r.get("headline_value") is None:
        return NONE
    return f"{metric_registry.label(key)} {metric_registry.format_value(key, r['headline_value'])}"


def tags_text(tags: Sequence[str]) -> str:
    return ", ".join(tags)
