"""The layers of a metric chart (app/charts/metric.py's ``metric_chart``): which are drawn, and each one.

Which layers a chart has is a pure decision over plain values (:class:`Drawn`: the rank mean or
per-rank lines, bucketed rows, smoothing, isolated ranks, superseded steps shown, NaN steps, a
marked step): :data:`LAYER_RULES` holds one row per :class:`Layer`, drawn when its rule holds, in
drawing order. Each layer is built by one small function (:data:`BUILDERS`) from the chart's
:class:`Parts`: its frames and the encodings every layer shares. Here too are the chart's
interactions: the box zoom, the shared cursor (alt-click) and the hover read-out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from db.vocabulary import metric_registry as registry

NAN_COLOR = "#d62728"
BAND_COLOR = "#7f7f7f"
CURSOR_COLOR = "#e4572e"  # the marked step: no rank's hue (rank_scale), a contrast over 3 on both themes
RULE_COLOR = "#8a8a8a"  # the hover rule: a contrast over 3 on the light and the dark theme (#555555: 2.4 on dark)
FADED_OPACITY = 0.12  # lines of the ranks not isolated
POINTS_BELOW = 60  # draw point markers on lines with fewer rows than this
BOX_DRAG = "[pointerdown[!event.shiftKey], window:pointerup] > window:pointermove!"
PAN_DRAG = "[pointerdown[event.shiftKey], window:pointerup] > window:pointermove!"
# Alt (option on a Mac): a plain click is the first of the double-click that resets the zoom, and
# the release of a drag (the box) or a shift-drag (the pan) is a click too, shift included.
PIN_CLICK = "click[event.altKey]"


class Layer(Enum):
    """One layer of a metric chart, in drawing order; the value says what it shows."""

    BAND = "a faint band from the lowest to the highest value any rank logged in each bucket"
    FAINT_RANKS = "the lines of the ranks not isolated, faint"
    LINES = "the lines, per rank or the rank mean (faint under the EMA when smoothing), with the box zoom"
    SMOOTHED = "the EMA, strong"
    PICKED = "the isolated ranks over the rank mean and its band"
    SUPERSEDED = "what abandoned attempts logged after the resume step, faint and dashed"
    NAN_RULES = "a red rule at every step that logged a NaN"
    CURSOR = "the marked step: a rule with every rank's value there, and a dot on each line"
    HOVER = "the hover read-out: a rule at the step nearest the pointer with every rank's value"


@dataclass(frozen=True)
class Drawn:
    """What decides a chart's layers, in plain values."""

    mean: bool  # the rank mean with its band, not a line per rank
    bucketed: bool  # rows are buckets of several steps: their min-max band keeps the spikes
    smoothing: bool
    isolated: bool  # ranks picked in the legend are among the chart's
    superseded: bool  # superseded steps are asked for and there are some
    nans: bool  # a step to mark with a NaN rule
    ranks: bool  # any rank's row to read out
    cursor: bool  # a step is marked on the section's charts, and this metric has a step near it


LAYER_RULES: tuple[tuple[Layer, Callable[[Drawn], bool]], ...] = (
    (Layer.BAND, lambda d: d.bucketed or d.mean),
    (Layer.FAINT_RANKS, lambda d: d.isolated and not d.mean),
    (Layer.LINES, lambda d: True),
    (Layer.SMOOTHED, lambda d: d.smoothing),
    (Layer.PICKED, lambda d: d.isolated and d.mean),
    (Layer.SUPERSEDED, lambda d: d.superseded),
    (Layer.NAN_RULES, lambda d: d.nans),
    (Layer.CURSOR, lambda d: d.cursor and d.ranks),
    (Layer.HOVER, lambda d: d.ranks),
)


def layers(drawn: Drawn) -> list[Layer]:
    """The layers of a chart, in drawing order: every one whose rule holds."""
    return [layer for layer, rule in LAYER_RULES if rule(drawn)]


@dataclass(frozen=True)
class Parts:
    """What a metric chart's layers are built from: its frames (displayed values) and the
    encodings they share."""

    key: str
    frame: pd.DataFrame  # the drawn series: per rank, or the rank mean
    per_rank: pd.DataFrame  # the ranks' own series (``frame`` itself unless it is the mean)
    strong: pd.DataFrame  # the lineage's lines drawn strong
    isolated: frozenset[str]  # ranks picked in the legend
    ranks: list[str]
    x: Any
    y: Callable[[str], alt.Y]
    color: Any  # the lines' colour: the mean's, or each rank's hue
    colors: alt.Scale  # each rank's hue
    band_color: str
    nans: pd.DataFrame  # the rows whose bucket logged a NaN, on the lineage unless superseded steps are shown
    read_out: pd.DataFrame | None  # one row per step with every rank's value (app/charts/metric.py's hover_frame)
    cursor_at: int | None  # this metric's step nearest the marked one
    smoothing: bool
    mean: bool
    bucketed: bool
    show_superseded: bool

    @property
    def drawn(self) -> Drawn:
        """What decides this chart's layers."""
        return Drawn(mean=self.mean, bucketed=self.bucketed, smoothing=self.smoothing, isolated=bool(self.isolated),
                     superseded=self.show_superseded and bool(self.frame["superseded"].any()),
                     nans=not self.nans.empty, ranks=not self.per_rank.empty, cursor=self.cursor_at is not None)

    @property
    def lineage(self) -> pd.DataFrame:
        return self.frame[~self.frame["superseded"]]

    @property
    def value(self) -> str:
        """The field the strong lines show."""
        return "smooth" if self.smoothing else "value"

    @property
    def tooltip(self) -> list[Any]:
        # Few tooltip fields, unformatted: Vega evaluates them for every row when it draws (the hover
        # rule's tooltip carries every rank's formatted value, one row per step).
        return ["rank:N", "step:Q", alt.Tooltip("value:Q", format=registry.d3_format(self.key))]


def _band(p: Parts) -> list[alt.Chart]:
    """Per attempt and x, the lowest and highest value any rank had in the bucket (one band for
    all ranks: 8 overlapping bands would hide the lines)."""
    envelope = p.lineage.groupby(["attempt", "step"], as_index=False, sort=True).agg(
        x=("x", "max"), lo=("lo", "min"), hi=("hi", "max"))  # ranks' wall times differ a little
    return [alt.Chart(envelope).mark_area(clip=True, opacity=0.15, color=p.band_color).encode(
        x=p.x, y=p.y("lo"), y2="hi:Q", detail="attempt:N")]


def _faint_ranks(p: Parts) -> list[alt.Chart]:
    # Separate data for strong and faint lines rather than conditions or filter transforms:
    # Streamlit's Vega runs expressions through an interpreter, per row and per layer.
    faint = p.lineage[~p.lineage["rank"].isin(p.isolated)]
    return [alt.Chart(faint).mark_line(clip=True, opacity=FADED_OPACITY).encode(
        x=p.x, y=p.y("value"), color=p.color, detail="series:N")]


def _lines(p: Parts) -> list[alt.Chart]:
    few = len(p.strong) < POINTS_BELOW
    return [alt.Chart(p.strong).encode(x=p.x, detail="series:N").mark_line(
        point=few and not p.smoothing, opacity=0.3 if p.smoothing else 1.0, clip=True).encode(
        y=p.y("value"), color=p.color, tooltip=p.tooltip).add_params(box_param())]


def _smoothed(p: Parts) -> list[alt.Chart]:
    return [alt.Chart(p.strong).encode(x=p.x, detail="series:N").mark_line(clip=True, strokeWidth=2).encode(
        y=p.y("smooth"), color=p.color, tooltip=[*p.tooltip, alt.Tooltip("smooth:Q", title="smoothed")])]


def _picked(p: Parts) -> list[alt.Chart]:
    picked = p.per_rank[~p.per_rank["superseded"] & p.per_rank["rank"].isin(p.isolated)]
    return [alt.Chart(picked).mark_line(clip=True, strokeWidth=1.5).encode(
        x=p.x, y=p.y(p.value), detail="series:N", color=alt.Color("rank:N", scale=p.colors, legend=None),
        tooltip=p.tooltip)]


def _superseded(p: Parts) -> list[alt.Chart]:
    return [alt.Chart(p.frame[p.frame["superseded"]]).mark_line(clip=True, opacity=0.35, strokeDash=[4, 3]).encode(
        x=p.x, y=p.y("value"), color=p.color, detail="series:N", tooltip=p.tooltip)]


def _nan_rules(p: Parts) -> list[alt.Chart]:
    marks = p.nans.groupby("x", as_index=False).agg(
        step=("step", "min"), ranks=("rank", lambda r: ", ".join(sorted(set(r)))))
    return [alt.Chart(marks).mark_rule(clip=True, color=NAN_COLOR, strokeDash=[2, 2], opacity=0.7).encode(
        x=p.x, tooltip=[alt.Tooltip("step:Q", title="NaN at step"), alt.Tooltip("ranks:N", title="rank")])]


def _cursor(p: Parts) -> list[alt.Chart]:
    """The marked step on this chart: a rule at this metric's step nearest it, with the read-out
    of every rank there, and a dot where each drawn line crosses it."""
    assert p.cursor_at is not None and p.read_out is not None  # drawn only then
    rule = alt.Chart(p.read_out[p.read_out["step"] == p.cursor_at]).mark_rule(
        clip=True, color=CURSOR_COLOR, strokeWidth=1.5, strokeDash=[6, 3]).encode(
        x=p.x, tooltip=read_out_tips(p.read_out, p.key, p.ranks))
    dots = alt.Chart(p.strong[p.strong["step"] == p.cursor_at]).mark_circle(clip=True, size=45, opacity=1.0).encode(
        x=p.x, y=p.y(p.value), color=p.color)
    return [rule, dots]


def _hover(p: Parts) -> list[alt.Chart]:
    """A vertical rule at the step nearest the pointer with a tooltip of every rank's value there
    (Altair's multi-line tooltip), carrying the x zoom of this chart (wheel; shift-drag pans;
    double-click resets)."""
    assert p.read_out is not None  # drawn only when there is a rank to read out
    nearest = alt.selection_point(name="hover", nearest=True, on="pointerover", clear="pointerout",
                                  fields=["x"], empty=False)
    zoom = alt.selection_interval(name="zoom", bind="scales", encodings=["x"], translate=PAN_DRAG)
    return [alt.Chart(p.read_out).mark_rule(clip=True, color=RULE_COLOR, strokeWidth=1).encode(
        x=p.x, opacity=alt.condition(nearest, alt.value(0.8), alt.value(0.0)),
        tooltip=read_out_tips(p.read_out, p.key, p.ranks),
    ).add_params(nearest, zoom, pin_param())]


BUILDERS: dict[Layer, Callable[[Parts], list[alt.Chart]]] = {
    Layer.BAND: _band,
    Layer.FAINT_RANKS: _faint_ranks,
    Layer.LINES: _lines,
    Layer.SMOOTHED: _smoothed,
    Layer.PICKED: _picked,
    Layer.SUPERSEDED: _superseded,
    Layer.NAN_RULES: _nan_rules,
    Layer.CURSOR: _cursor,
    Layer.HOVER: _hover,
}


def axes(fitted: pd.DataFrame, key: str, x_title: str, temporal: bool, log_y: bool,
         zoom_x: tuple[float, float] | None, own_box: tuple[float, float] | None) -> tuple[Any, Callable[[str], alt.Y]]:
    """The x encoding, and the y encoding of a field: the zoom's x range, and the y range the
    zoom gives (``own_box``, when the box was drawn on this chart; else ``fitted``'s values in that
    x range), log or linear, titled and formatted by the metric registry."""
    x_domain: Any = list(zoom_x) if zoom_x else alt.Undefined
    one_x = single_value(fitted[["x"]].rename(columns={"x": "value"})) if not zoom_x and "x" in fitted else None
    if one_x is not None and not temporal:  # one step: round ticks around it, as for one value below
        x_domain = [one_x - (abs(one_x) * 0.05 or 1.0), one_x + (abs(one_x) * 0.05 or 1.0)]
    x = alt.X("x:T" if temporal else "x:Q", title=x_title,
              scale=alt.Scale(zero=False, domain=x_domain, nice=True if one_x is not None else alt.Undefined)
              if not temporal else alt.Scale(domain=x_domain))
    y_domain: Any = alt.Undefined
    flat = None
    if zoom_x is not None:
        box = own_box if own_box is not None else fitted_y(fitted, zoom_x, log_y)
        y_domain = list(box) if box else alt.Undefined
    elif (flat := single_value(fitted)) is not None and not log_y:
        # One value (a single point, or a flat line): Vega would put its one tick at the value
        # itself ("97.214485"); a range around it, made nice, has round ticks.
        pad = abs(flat) * 0.05 or 1.0
        y_domain = [flat - pad, flat + pad]
    scale = (alt.Scale(type="log", domain=y_domain) if log_y
             else alt.Scale(zero=False, domain=y_domain, nice=True if flat is not None else alt.Undefined))
    title = registry.axis_title(key) + (", log scale" if log_y else "")
    axis = alt.Axis(format=registry.axis_format(key) or alt.Undefined)
    return x, lambda field: alt.Y(f"{field}:Q", scale=scale, title=title, axis=axis)


def single_value(frame: pd.DataFrame) -> float | None:
    """The one value ``frame`` holds (its values, lows and highs all equal), or None."""
    values = pd.concat([frame[c] for c in ("value", "lo", "hi") if c in frame]).to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    return float(values[0]) if values.size and values.min() == values.max() else None


def fitted_y(frame: pd.DataFrame, x: tuple[float, float], log_y: bool) -> tuple[float, float] | None:
    """The y range of what ``frame`` (displayed values) holds between ``x``, with a little room."""
    inside = frame[(frame["x"] >= x[0]) & (frame["x"] <= x[1])]
    values = pd.concat([inside[c] for c in ("value", "lo", "hi") if c in inside]).to_numpy(dtype=float)
    values = values[np.isfinite(values) & ((values > 0) if log_y else True)]
    if values.size == 0:
        return None
    lo, hi = float(values.min()), float(values.max())
    if log_y:
        return lo / 1.1, hi * 1.1
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    return lo - pad, hi + pad


def read_out_tips(wide: pd.DataFrame, key: str, ranks: Sequence[str]) -> list[alt.Tooltip]:
    """The tooltip of a step: the step, the mean and band when drawn, and every rank's value."""
    fmt = registry.d3_format(key)
    tips = [alt.Tooltip("step:Q", title="step", format=",d")]
    tips += [alt.Tooltip(f"{c}:Q", title=c, format=fmt) for c in ("mean", "min", "max") if c in wide]
    return tips + [alt.Tooltip(f"r{r}:Q", title=f"rank {r}", format=fmt) for r in ranks]


def box_param() -> Any:
    """The box zoom: a drag draws a box (x and y); the page reads it (st.altair_chart on_select)
    and zooms every chart of the section to it; a double-click clears it."""
    return alt.selection_interval(name="box", encodings=["x", "y"], on=BOX_DRAG, translate=False, zoom=False,
                                  clear="dblclick")


def pin_param() -> Any:
    """The shared cursor: an alt-click marks the nearest step (the page reads it, st.altair_chart
    on_select, and marks that step on every chart of the section)."""
    return alt.selection_point(name="pin", nearest=True, on=PIN_CLICK, fields=["step"], empty=False, clear=False)
