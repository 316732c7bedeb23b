"""The Runs list's grid: each column's cells as text a person reads (never "None" or "nan"), and
each column's width from its content, so that no cell is cut ("failec", "queued: wai", a best
loss without its leading digit) and the default columns fit the grid without scrolling inside it
(:func:`fit_columns`: empty columns and the least needed go, the long texts give way), at the width
the page measured (:data:`WIDTH_JS`, a component the Runs page mounts), 1280 px's until it has.

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

from db.states import RunStatus
from db.vocabulary import metric_registry
from orchestrator.format import start_text

NONE = "–"  # a cell with nothing to say
# Pixels per character of the grid's 14 px sans-serif (Source Sans), by kind: wide letters,
# digits and capitals, narrow ones, the rest. Slightly over the font's own advances so that a
# width from them never cuts (tests/browser/test_runs_grid_browser.py measures the real text).
WIDE, CAPITAL, DIGIT, NARROW, OTHER = 12.5, 8.6, 7.3, 4.2, 7.4
WIDE_CHARS, NARROW_CHARS = set("mwMW@%"), set("iljtfrI.,:;'|!()[] ")
PADDING_PX = 20  # the grid's cell padding, both sides, and a margin
MIN_PX = 44  # a column no narrower than this
HEADER_ICON_PX = 16  # beside a header's title: the column menu's icon the grid shows on hover
# The widest each column gets; a longer text is shortened with "…" (LONG columns) or cannot be
# longer (the others' texts are bounded: a status word, a price, a step count).
MAX_PX: dict[str, int] = {"name": 220, "waiting for": 460, "tags": 200, "note": 240, "sweep": 200, "headline": 190,
                          "alert": 160, "ends at": 190, "where": 160}
LONG = ("waiting for", "tags", "note", "name", "sweep", "headline", "alert", "where")
WAITING = {RunStatus.QUEUED.value, RunStatus.RETRYING.value}
# Each column's help in the header's tooltip, where it has one.
HELPS = {
    "★": "Starred (select the row, then Star)",
    "waiting for": "Why a queued or retrying run waits, and when a queued one should start (a long reason ends in …: "
                   "the run's page says it whole)",
    "energy": "Measured (≈: estimated from power x time); – not measured (docs/COSTS.md)",
    "your cost": "Energy x your tariff x PUE + your hardware's amortisation, so far (Settings); – until you set your "
                 "electricity tariff in Settings",
    "cost": "Cloud reference: device time at the list price the run was submitted at, so far, every attempt included",
    "projected": "Cloud reference so far + ETA x the run's list price",
    "best loss": "The lowest loss along the run's lineage, a fork's parent's steps included (the mean over ranks); – "
                 "before any",
    "headline": "The final value of the workload's headline metric (eval accuracy, eval loss…)",
    "alert": "An open alert (docs/ALERTS.md): its triggers",
}
PROGRESS_PX = 130  # a progress bar and its "100.00%"
# The columns' total width the grid shows without scrolling in a 1280 px window (the page's
# padding, the row markers and a scrollbar taken off; tests/browser/test_runs_grid_browser.py
# measures it): the default columns fit it, the long ones shortened with "…" when they must.
FIT_PX = 1070  # measured: the grid 1118 px inside its border, less its row markers (32) and a scrollbar

# The default columns that give way when the grid would not hold them (fit_columns): first any
# of them with nothing to say in any row (no alert, no tariff set, no run waiting); then these
# whole, the first first, when that keeps the long texts at LONG_COMFORT_PX; else the long columns
# give way down to their header's width, and only then do these go, then LAST_LEFT_OUT.
EMPTY_FIRST = ("waiting for", "alert", "energy", "your cost", "tags", "headline")
LEFT_OUT_ORDER = ("energy", "step", "your cost", "elapsed")
LAST_LEFT_OUT = ("cost",)  # the cloud reference, when even the long columns at their narrowest leave no room
LONG_FLOOR_PX = 80  # a long column gives way down to this (or its header's width), no narrower
LONG_COMFORT_PX = 170  # ... but first the columns of LEFT_OUT_ORDER go, while it would be narrower than this


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


def fitted(frame: pd.DataFrame, titles: Mapping[str, str], shown: Sequence[str] | None = None,
           fit_px: int = FIT_PX, floor_px: int = LONG_FLOOR_PX) -> tuple[pd.DataFrame, dict[str, int]]:
    """The frame with its long texts shortened to their column's widest, and each text column's
    width (``titles``: the header each column shows, when not its name). When the ``shown``
    columns (default: all) would be wider together than ``fit_px``, the LONG columns give way,
    the widest first, down to ``floor_px`` or their header's width: their texts end in "…" sooner."""
    natural = {c: _width(c, titles, [str(t) for t in frame[c]], MAX_PX.get(c)) for c in frame.columns}
    natural["progress"] = PROGRESS_PX
    caps = _caps(natural, titles, [c for c in (frame.columns if shown is None else shown) if c in natural], fit_px,
                 floor_px)
    widths: dict[str, int] = {}
    out = frame.copy()
    for column in frame.columns:
        limit = caps.get(column, MAX_PX.get(column))
        if column in LONG and limit is not None:
            out[column] = [shortened(str(t), limit - PADDING_PX) for t in frame[column]]
        widths[column] = _width(column, titles, [str(t) for t in out[column]], limit)
    widths["progress"] = PROGRESS_PX
    return out, widths


def fit_columns(frame: pd.DataFrame, titles: Mapping[str, str], shown: Sequence[str],
                fit_px: int = FIT_PX) -> tuple[pd.DataFrame, dict[str, int], list[str], list[str]]:
    """:func:`fitted` for the default columns ``shown``, leaving out what must go for them to fit
    ``fit_px``: the columns of :data:`EMPTY_FIRST` with nothing in any row; then those of
    :data:`LEFT_OUT_ORDER`, one by one, when that keeps the long texts at :data:`LONG_COMFORT_PX`
    at least; else (when no number of them would) the long columns give way down to their header's
    width, all the columns kept, and only then do those of :data:`LEFT_OUT_ORDER` and
    :data:`LAST_LEFT_OUT` go, one by one. The frame, the widths, the columns kept, and those left out that had
    something to say (a page names them)."""
    empty = {c for c in EMPTY_FIRST if c in frame.columns and all(str(v) in ("", NONE) for v in frame[c])}
    full = [c for c in shown if c not in empty]
    drops = [c for c in (*LEFT_OUT_ORDER, *LAST_LEFT_OUT) if c in full]
    first = [c for c in LEFT_OUT_ORDER if c in full]
    stages = [(drops[:n], LONG_COMFORT_PX) for n in range(len(first) + 1)]
    stages += [(drops[:n], LONG_FLOOR_PX) for n in range(len(drops) + 1)]
    for dropped, floor in stages:
        kept = [c for c in full if c not in dropped]
        out, widths = fitted(frame, titles, kept, fit_px, floor)
        if sum(widths[c] for c in kept) <= fit_px:
            break
    return out, widths, kept, dropped  # the last stage when none fits: the grid scrolls


def _width(column: str, titles: Mapping[str, str], texts: Sequence[str], limit: int | None) -> int:
    # A link column shows its run's id (display_text), not the address it holds.
    shown = [t.rpartition("=")[2] for t in texts] if column == "run" else texts
    return column_width(titles.get(column, column), shown, limit)


def _caps(natural: Mapping[str, int], titles: Mapping[str, str], shown: Sequence[str], fit_px: int,
          floor_px: int) -> dict[str, int]:
    """The widest each LONG column of ``shown`` may be for all of them to fit ``fit_px``: one cap
    for all (the widest give way first), none lower than the column's header or ``floor_px`` (nor
    wider than its text)."""
    long = [c for c in shown if c in LONG]
    room = fit_px - sum(natural[c] for c in shown if c not in LONG)
    if not long or sum(natural[c] for c in long) <= room:
        return {}
    floors = {c: min(natural[c], max(floor_px, column_width(titles.get(c, c), []))) for c in long}

    def total(cap: int) -> int:
        return sum(max(floors[c], min(natural[c], cap)) for c in long)

    lo, hi = 0, max(natural[c] for c in long)  # total(hi) > room; find the largest cap that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if total(mid) <= room else (lo, mid - 1)
    return {c: max(floors[c], min(natural[c], lo)) for c in long if natural[c] > lo}


def loss_text(value: float | None) -> str:
    """A best loss as the list shows it: four significant digits, "–" without one."""
    return NONE if value is None or not math.isfinite(value) else f"{value:.4g}"


def progress_percent(progress: float | None) -> float:
    """A run's progress in percent with two decimals, rounded down (a run at 99.996% is not done):
    0 without one."""
    if progress is None or not math.isfinite(progress):
        return 0.0
    return math.floor(max(0.0, min(1.0, progress)) * 10000 + 1e-6) / 100


def headline_text(r: Mapping[str, Any]) -> str:
    """The run's headline metric as the Run page labels it: "Eval accuracy 98.3%"; "–" without one."""
    key = r.get("headline_key")
    if key is None or r.get("headline_value") is None:
        return NONE
    return f"{metric_registry.label(key)} {metric_registry.format_value(key, r['headline_value'])}"


def tags_text(tags: Sequence[str]) -> str:
    return ", ".join(tags)


def trial_text(trial: Mapping[str, Any] | None) -> str:
    """Which sweep's trial a run is: ``lr-search #3, trial 4``; empty for a run of no sweep."""
    return f"{trial['sweep_name']} #{trial['sweep_id']}, trial {trial['number']}" if trial else ""


def waiting_text(r: Mapping[str, Any]) -> str:
    """Why a queued or retrying run waits; for a queued one, when it should start first
    (``starts ≈ 15:40, after run 38; queued: waiting for 2 free GPU(s) …``)."""
    if r["status"] not in WAITING:
        return ""
    start = start_text(r.get("start_estimate"), short=True)
    return "; ".join(part for part in (start, r["status_reason"] or "") if part)
