"""Chart builders: plain functions from rows and DataFrames to Altair charts.

A metric chart is drawn from the metric store's buckets (see db/metricstore/): each row is
one (attempt, rank, bucket of steps) with its mean, min, max and NaN count, so a run of millions
of points arrives as at most a few thousand rows per chart. ``series_frame`` shapes those rows
for the options a person picked (per-rank lines or the rank mean with a band, the x axis,
smoothing, log scale, the lineage), and ``metric_chart`` draws the frame with the metric's
label, unit and number format from db/vocabulary/metric_registry.py; which layers it has, and
each layer, are app/charts/layers.py's.

Ranks: each rank has one hue of ``PALETTE`` (strong, colour-blind-aware, no pairs, no pale
yellow), the same on every chart and in the section's one legend (``rank_legend``), where a click
isolates a rank on every chart. From ``MEAN_FROM_RANKS`` ranks the default is the rank mean with
its min-max band. Every chart has a hover read-out (a vertical rule and a tooltip with every
rank's value at the nearest step) and zooms on x (wheel or pinch, drag to pan, double-click to
reset).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import altair as alt
import numpy as np
import pandas as pd

from app.charts import values as value_rules
from app.charts.layers import BAND_COLOR, BUILDERS, Parts, axes, layers
from app.charts.values import LOG_FROM_DECADES
from db.vocabulary import metric_registry as registry

# Altair's debug mode validates every schema object against Vega-Lite's JSON schema as it is built
# (for better error messages while a chart is written); the UI builds the same charts on every
# redraw. tests/unit/app/charts/test_metric.py validates each builder's whole spec instead (``to_dict()``).
alt.utils.schemapi.disable_debug_mode()

PER_RANK = "per rank"
RANK_MEAN = "mean + band"
RANK_MODES = (PER_RANK, RANK_MEAN)
X_STEP, X_WALL, X_RELATIVE = "step", "wall time", "relative time"
X_AXES = (X_STEP, X_WALL, X_RELATIVE)
MEAN_COLOR = "#6b7280"  # slate grey: no rank's hue, and read on the light and the dark theme alike
# One strong hue per rank, in an order that keeps neighbours apart: Okabe & Ito's colour-blind-safe
# set without its yellow and black (yellow vanishes on white, black on the dark theme), then Paul
# Tol's indigo and wine lightened (his own vanished on the dark theme's background: contrast 1.6
# and 2.2), green, olive, purple and teal. Every hue has a contrast of at least 2.2 on white and
# on the dark theme's #0e1117 (tests/unit/app/charts/test_metric.py). No light/dark pairs (category20 suggested
# pairs of ranks that do not exist). Ranks past 12 reuse hues; from 8 ranks the mean is the default.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#7A6FD0", "#B5457E",
           "#117733", "#999933", "#AA4499", "#44AA99")
MEAN_FROM_RANKS = 8

Chart = TypeVar("Chart", bound=alt.TopLevelMixin)


def unvalidated(chart: Chart) -> Chart:
    """``chart`` for ``st.altair_chart``: its ``to_dict`` skips the JSON-schema validation.

    Streamlit turns a chart into its spec with ``chart.to_dict()``, which validates the whole
    Vega-Lite spec against the schema every time: about a tenth of a Run page's script time on
    the server, paid again on every live redraw. The builders here are validated by
    tests/unit/app/charts/test_metric.py, which calls ``to_dict()`` on the charts themselves.
    """
    # Not ``chart.to_dict = ...``: Altair keeps attributes set on a chart as parts of its spec.
    object.__setattr__(chart, "to_dict", functools.partial(type(chart).to_dict, chart, validate=False))
    return chart


@dataclass(frozen=True)
class Zoom:
    """A box zoom, shared by the charts of a section: the x range of the box drawn on the chart of
    ``key`` (in the x axis's values), and its y range (in that metric's displayed unit). That chart
    shows the box; every other chart shows the x range with its y axis fitted to what lies in it."""

    x: tuple[float, float]
    y: tuple[float, float]
    key: str
    x_axis: str  # the X axis the box was drawn on (a box on steps means nothing on wall time)

    @staticmethod
    def from_selection(box: Mapping[str, Any], key: str, x_axis: str) -> Zoom | None:
        """The zoom a chart's ``box`` selection (Vega-Lite's ``{"x": [..], "value": [..]}``) asks for."""
        xs, ys = box.get("x"), box.get("value")
        if not xs or not ys or len(xs) != 2 or len(ys) != 2:
            return None
        x0, x1 = sorted(float(v) for v in xs)
        y0, y1 = sorted(float(v) for v in ys)
        return Zoom((x0, x1), (y0, y1), key, x_axis) if x1 > x0 and y1 > y0 else None


@dataclass(frozen=True)
class ChartOptions:
    """How the metric charts of one run are drawn (the widgets above the charts)."""

    ranks: str = PER_RANK  # PER_RANK: one line per rank; RANK_MEAN: the mean, min/max band across ranks
    x: str = X_STEP  # X_STEP, X_WALL (clock time) or X_RELATIVE (since the run started)
    log_keys: frozenset[str] = field(default_factory=frozenset)  # the metrics drawn on a log y axis
    smoothing: float = 0.0  # EMA weight in [0, 1): 0 draws the values as they are
    show_superseded: bool = False  # what abandoned attempts logged after the resume step, faint
    isolated: tuple[str, ...] = ()  # ranks picked in the legend: drawn strong, the others faint
    zoom: Zoom | None = None  # the box a person drew on one chart of the section: every chart shows its x range
    cursor: int | None = None  # the step a person clicked on one chart of the section: marked on every chart

    def log_y(self, key: str) -> bool:
        """Whether ``key``'s chart has a log y axis (never for a share such as accuracy)."""
        return key in self.log_keys and registry.spec_for(key).log_ok

    def zoomed(self, key: str) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
        """The zoom's x range (on this x axis: a box on steps means nothing on wall time), and its
        y range when the box was drawn on ``key``'s chart."""
        zoom = self.zoom if self.zoom is not None and self.zoom.x_axis == self.x else None
        return (zoom.x if zoom else None), (zoom.y if zoom and zoom.key == key else None)


def spans_decades(rows: Sequence[Mapping[str, Any]], decades: float = LOG_FROM_DECADES) -> bool:
    """Whether the values of ``rows`` (a metric's buckets: ``value``) span more than ``decades``
    powers of ten (app/charts/values.py: the rule every log axis follows)."""
    return value_rules.spans_decades((r.get("value") for r in rows), decades)


def auto_log_keys(series: Mapping[str, Sequence[Mapping[str, Any]]]) -> frozenset[str]:
    """The metrics drawn on a log y axis until a person chooses: those a log axis suits
    (never a share such as accuracy) whose values span more than ``LOG_FROM_DECADES`` decades."""
    return frozenset(k for k, rows in series.items() if registry.spec_for(k).log_ok and spans_decades(rows))


def default_rank_mode(nproc: int) -> str:
    """Per-rank lines up to 7 ranks; from ``MEAN_FROM_RANKS`` the mean with its band."""
    return RANK_MEAN if nproc >= MEAN_FROM_RANKS else PER_RANK


def rank_color(rank: str) -> str:
    """The hue of ``rank`` ("0", "1", ...), the same on every chart; the mean's for "mean"."""
    return PALETTE[int(rank) % len(PALETTE)] if rank.isdigit() else MEAN_COLOR


def rank_scale(ranks: Sequence[str]) -> alt.Scale:
    """The colour scale of ``ranks`` in numeric order, each in its own hue."""
    ordered = sorted(ranks, key=lambda r: (not r.isdigit(), int(r) if r.isdigit() else 0, r))
    return alt.Scale(domain=ordered, range=[rank_color(r) for r in ordered])


# -- shaping ---------------------------------------------------------------------------------


def ema(values: pd.Series, weight: float) -> pd.Series:
    """Exponential moving average with TensorBoard's bias correction, skipping NaN and infinite
    values (they neither poison the average nor get a smoothed value of their own)."""
    if weight <= 0 or values.empty:
        return values.astype(float)
    finite = values.where(np.isfinite(values.astype(float)))
    # adjust=True is exactly the debiased ``last = w * last + (1 - w) * v`` of TensorBoard.
    smooth = finite.ewm(alpha=1.0 - weight, adjust=True, ignore_na=True).mean()
    return smooth.where(finite.notna())


def time_unit(span_s: float) -> tuple[str, float]:
    """The unit a time axis of ``span_s`` seconds reads best in, and its seconds (Run page and Compare)."""
    if span_s >= 3 * 3600:
        return "h", 3600.0
    if span_s >= 3 * 60:
        return "min", 60.0
    return "s", 1.0


def series_frame(
    rows: Sequence[Mapping[str, Any]],
    cutoffs: Mapping[int, float],
    options: ChartOptions,
    started_at: float | None = None,
    log_y: bool = False,
) -> tuple[pd.DataFrame, str]:
    """The rows of one metric shaped for ``metric_chart``, and the x axis title.

    Args:
        rows: the store's buckets (attempt, rank, step, last_step, value, min, max, count,
            nan_count, wall_time), raw points being buckets of one step.
        cutoffs: per attempt, the last step on the run's lineage (db.run_summary.lineage_cutoffs);
            a bucket starting after it is superseded.
        options: what to draw.
        started_at: the run's start (epoch seconds), for the relative time axis.
        log_y: for a log y axis: values of zero or less are left out (NaN).

    Returns:
        One row per line point with ``attempt``, ``rank`` (text, "mean" for the rank mean),
        ``series``, ``step``, ``x``, ``value``, ``lo``/``hi`` (the band), ``smooth`` (the EMA, or
        NaN without smoothing), ``nan`` (NaN values in the bucket), ``count`` and
        ``superseded``; and the x axis title.
    """
    columns = ["attempt", "rank", "series", "step", "x", "value", "lo", "hi", "smooth", "nan", "count", "superseded"]
    if not rows:
        empty = pd.DataFrame({c: pd.Series(dtype=float) for c in columns})
        return empty.astype({"rank": str, "series": str, "nan": bool, "superseded": bool}), options.x
    f = pd.DataFrame.from_records(rows)
    f["value"] = f["value"].astype(float)
    f["lo"] = f["min"].astype(float).fillna(f["value"]) if "min" in f else f["value"]
    f["hi"] = f["max"].astype(float).fillna(f["value"]) if "max" in f else f["value"]
    f["count"] = f.get("count", 1)
    nan_count = f.get("nan_count", 0)
    f["nan"] = (nan_count > 0) | f["value"].isna()
    f["superseded"] = f["step"] > f["attempt"].map(lambda a: cutoffs.get(a, math.inf))
    if options.ranks == RANK_MEAN:
        f = (
            f.groupby(["attempt", "step", "superseded"], as_index=False, sort=True)
            .agg(value=("value", "mean"), lo=("lo", "min"), hi=("hi", "max"), nan=("nan", "any"),
                 count=("count", "sum"), wall_time=("wall_time", "max"))
            .assign(rank="mean")
        )
    else:
        f["rank"] = f["rank"].astype(str)
    f["series"] = f["rank"] + "/" + f["attempt"].astype(str) + f["superseded"].map({True: "s", False: ""})
    f = f.sort_values(["series", "step"], kind="stable").reset_index(drop=True)
    f["smooth"] = (
        f.groupby("series", sort=False)["value"].transform(lambda v: ema(v, options.smoothing))
        if options.smoothing > 0 else np.nan
    )
    if log_y:  # a log scale cannot show zero or less
        for col in ("value", "lo", "hi", "smooth"):
            f[col] = f[col].where(f[col] > 0)
    title = "step"
    if options.x == X_WALL:
        f["x"] = f["wall_time"] * 1000.0  # epoch milliseconds: Vega's temporal values
        title = "wall time"
    elif options.x == X_RELATIVE:
        start = started_at if started_at is not None else float(f["wall_time"].min())
        unit, div = time_unit(float(f["wall_time"].max()) - start)
        f["x"] = (f["wall_time"] - start) / div
        title = f"time since start ({unit})"
    else:
        f["x"] = f["step"]
    return f[columns], title


# -- charts ----------------------------------------------------------------------------------


def displayed(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """``frame``'s values in the displayed unit of ``key`` (step_time in ms, mfu in percent; a
    share whose series holds a value beyond ±1 was logged in percent already)."""
    if frame.empty:
        return frame
    scale = registry.display_scale(key, frame["value"].to_numpy(dtype=float, na_value=float("nan")).tolist())
    if scale == 1.0:
        return frame
    return frame.assign(**{c: frame[c] * scale for c in ("value", "lo", "hi", "smooth")})


def _by_rank(per_rank: pd.DataFrame) -> pd.DataFrame:
    """The lineage's values, one row per step and one column per rank (one pivot, shared by the
    hover read-out and the identical-ranks check)."""
    lineage = per_rank[~per_rank["superseded"]].drop_duplicates(["step", "rank"], keep="last")
    return lineage.pivot(index="step", columns="rank", values="value")


def hover_frame(per_rank: pd.DataFrame, mean: pd.DataFrame | None = None,
                wide: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per step of the lineage for the hover read-out: ``step``, ``x`` and each rank's
    value as ``r<rank>`` (and ``mean``, ``min``, ``max`` from ``mean``, the rank-mean frame);
    ``wide`` is ``per_rank`` already pivoted, when the caller has it."""
    wide = (_by_rank(per_rank) if wide is None else wide).rename(columns=lambda r: f"r{r}")
    out = per_rank[~per_rank["superseded"]].groupby("step")["x"].max().to_frame().join(wide)
    if mean is not None and not mean.empty:
        m = mean[~mean["superseded"]].groupby("step").agg(mean=("value", "last"), min=("lo", "min"), max=("hi", "max"))
        out = out.join(m)
    return out.reset_index()


def identical_ranks(per_rank: pd.DataFrame, wide: pd.DataFrame | None = None) -> list[list[str]]:
    """Groups of two or more ranks whose lines are the same at every step (one line hides the
    others), in rank order."""
    wide = _by_rank(per_rank) if wide is None else wide
    groups: dict[bytes, list[str]] = {}
    for rank in wide.columns:
        groups.setdefault(wide[rank].to_numpy(dtype=float).tobytes(), []).append(str(rank))
    return sorted((sorted(g, key=int) for g in groups.values() if len(g) > 1 and all(r.isdigit() for r in g)),
                  key=lambda g: int(g[0]))


def nearest_step(steps: pd.Series, step: int) -> int | None:
    """The step of ``steps`` closest to ``step`` (a metric logged every 50 steps is marked at its
    own step nearest the one clicked on another chart)."""
    if steps.empty:
        return None
    return int(steps.iloc[int((steps - step).abs().to_numpy().argmin())])


def metric_chart(frame: pd.DataFrame, key: str, options: ChartOptions, x_title: str = "step",
                 bucketed: bool = False, per_rank: pd.DataFrame | None = None) -> alt.LayerChart:
    """One metric of one run: lines (per rank, or the rank mean), a faint band from the lowest
    to the highest value any rank logged in each bucket (for the rank mean, or when ``bucketed``:
    spikes survive the downsampling), the EMA strong over the faint values when smoothing,
    superseded steps faint and dashed, a red rule at every step that logged a NaN, and the hover
    read-out of every rank's value (``per_rank``: the per-rank frame, when ``frame`` is the mean).
    Titles, units and number formats come from the metric registry; ranks in
    ``options.isolated`` are drawn strong and the others faint. Which layers are drawn is
    app/charts/layers.py's table; each is built there.
    """
    frame = displayed(frame, key)
    per_rank = displayed(per_rank, key) if per_rank is not None else frame
    wide = _by_rank(per_rank)  # one pivot: the read-out and the subtitle
    parts = _parts(frame, per_rank, wide, key, options, x_title, bucketed)
    charts = [chart for layer in layers(parts.drawn) for chart in BUILDERS[layer](parts)]
    same = identical_ranks(per_rank, wide) if not parts.mean else []  # what the chart does not show by itself
    subtitle = "; ".join(f"ranks {', '.join(group)} identical (one line)" for group in same)
    title = alt.Title(registry.label(key), subtitle=subtitle) if subtitle else registry.label(key)
    return alt.layer(*charts, title=title).properties(height=260)


def _parts(frame: pd.DataFrame, per_rank: pd.DataFrame, wide: pd.DataFrame, key: str, options: ChartOptions,
           x_title: str, bucketed: bool) -> Parts:
    """What the layers of ``frame`` are built from (both frames in displayed values; ``wide``:
    the per-rank one pivoted)."""
    mean = options.ranks == RANK_MEAN
    ranks = sorted({str(r) for r in per_rank["rank"]} - {"mean"}, key=lambda r: int(r) if r.isdigit() else -1)
    colors = rank_scale(ranks or ["0"])
    isolated = frozenset(options.isolated) & frozenset(ranks)
    lineage = frame[~frame["superseded"]]
    read_out = hover_frame(per_rank, frame if mean else None, wide) if not per_rank.empty else None
    x, y = axes(per_rank if not mean else frame, key, x_title, options.x == X_WALL, options.log_y(key),
                *options.zoomed(key))
    return Parts(
        key=key, frame=frame, per_rank=per_rank, isolated=isolated, ranks=ranks, x=x, y=y, colors=colors, mean=mean,
        bucketed=bucketed, show_superseded=options.show_superseded,
        strong=lineage if mean or not isolated else lineage[lineage["rank"].isin(isolated)],
        # No legend on a chart: the section has one (rank_legend).
        color=alt.value(MEAN_COLOR) if mean else alt.Color("rank:N", scale=colors, legend=None),
        band_color=MEAN_COLOR if mean else BAND_COLOR,
        nans=frame[frame["nan"] & (options.show_superseded | ~frame["superseded"])],
        read_out=read_out, smoothing=options.smoothing > 0, cursor_at=None if read_out is None or options.cursor is None
        else nearest_step(read_out["step"], options.cursor))


def metric_view(rows: Sequence[Mapping[str, Any]], cutoffs: Mapping[int, float], options: ChartOptions, key: str,
                started_at: float | None = None, bucketed: bool = False) -> alt.LayerChart:
    """``series_frame`` and ``metric_chart`` for one metric: the chart of the Run page."""
    log_y = options.log_y(key)
    frame, x_title = series_frame(rows, cutoffs, options, started_at, log_y=log_y)
    per_rank = frame if options.ranks == PER_RANK else series_frame(
        rows, cutoffs, replace(options, ranks=PER_RANK), started_at, log_y=log_y)[0]
    return metric_chart(frame, key, options, x_title, bucketed, per_rank=per_rank)


LEGEND_HEIGHT = 26  # px: the rank strip's buttons, each with its label inside


def rank_legend(ranks: Sequence[str]) -> alt.LayerChart:
    """The section's one legend: a strip of one button per rank in its hue, labelled "rank N"
    inside it. A click on a button (its label included) selects that rank in the ``isolate``
    parameter (shift-click adds one, double-click clears);
    the page reads the selection (st.altair_chart on_select) and isolates the rank on every
    chart, so the choice holds across the live refreshes. The labels were once an axis above
    10-px bars: a click on a label, where people click, selected nothing."""
    scale = rank_scale(ranks)
    pick = alt.selection_point(name="isolate", fields=["rank"], on="click", toggle="event.shiftKey", clear="dblclick")
    frame = pd.DataFrame({"rank": list(ranks), "label": [f"rank {r}" for r in ranks]})
    x = alt.X("rank:N", title=None, axis=None, scale=alt.Scale(domain=scale.domain, paddingInner=0.15))
    buttons = alt.Chart(frame).mark_rect(cornerRadius=4, cursor="pointer").encode(
        x=x, y=alt.value(0), y2=alt.value(LEGEND_HEIGHT), color=alt.Color("rank:N", scale=scale, legend=None),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.3)),
        tooltip=[alt.Tooltip("label:N", title="click to isolate")],
    ).add_params(pick)
    # White on every hue of PALETTE (all strong). A label's datum is its rank's row, so a click on it
    # selects the rank as a click on the button does (Vega-Lite's point selection takes the datum
    # under the pointer, whichever layer drew it; an axis label's datum holds no rank).
    labels = alt.Chart(frame).mark_text(color="white", fontSize=13, fontWeight="bold", cursor="pointer",
                                        baseline="middle").encode(x=x, y=alt.value(LEGEND_HEIGHT / 2), text="label:N")
    return alt.layer(buttons, labels).properties(height=LEGEND_HEIGHT).configure_view(stroke=None)


# An attempt's outcome and its bar's colour on the timeline.
OUTCOME_COLORS = {"SUCCEEDED": "#2ca02c", "RUNNING": "#1f77b4", "PAUSED": "#9467bd", "CANCELLED": "#7f7f7f",
                  "PREEMPTED": "#ff7f0e", "FAILED": "#d62728"}


def attempt_timeline(attempts: pd.DataFrame) -> alt.Chart:
    """One bar per attempt from launch to end, coloured by how it ended; the legend names only
    the outcomes its bars have (each keeps its colour whatever the others are)."""
    present = [o for o in OUTCOME_COLORS if o in set(attempts["outcome"])]
    present += sorted(set(attempts["outcome"]) - set(present))  # an outcome without a colour of its own
    return (
        alt.Chart(attempts, title="attempts")
        .mark_bar(cornerRadius=3, height=18)
        .encode(
            x=alt.X("start:T", title="time"),
            x2="end:T",
            y=alt.Y("attempt:O", title="attempt"),
            color=alt.Color("outcome:N", title="ended", scale=alt.Scale(
                domain=present, range=[OUTCOME_COLORS.get(o, "#bcbd22") for o in present])),
            tooltip=["attempt", "outcome", "cause", "steps", "reason"],
        )
        .properties(height=40 + 26 * len(attempts))
    )
