"""Chart builders: plain functions from rows and DataFrames to Altair charts.

A metric chart is drawn from the metric store's buckets (see db/metricstore.py): each row is
one (attempt, rank, bucket of steps) with its mean, min, max and NaN count, so a run of millions
of points arrives as at most a few thousand rows per chart. ``series_frame`` shapes those rows
for the options a person picked (per-rank lines or the rank mean with a band, the x axis,
smoothing, log scale, the lineage), and ``metric_chart`` draws the frame.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

PER_RANK = "per rank"
RANK_MEAN = "mean + band"
RANK_MODES = (PER_RANK, RANK_MEAN)
X_STEP, X_WALL, X_RELATIVE = "step", "wall time", "relative time"
X_AXES = (X_STEP, X_WALL, X_RELATIVE)
NAN_COLOR = "#d62728"
MEAN_COLOR = "#1f77b4"
BAND_COLOR = "#7f7f7f"
POINTS_BELOW = 60  # draw point markers on lines with fewer rows than this


@dataclass(frozen=True)
class ChartOptions:
    """How the metric charts of one run are drawn (the widgets above the charts)."""

    ranks: str = PER_RANK  # PER_RANK: one line per rank; RANK_MEAN: the mean, min/max band across ranks
    x: str = X_STEP  # X_STEP, X_WALL (clock time) or X_RELATIVE (since the run started)
    log_y: bool = False
    smoothing: float = 0.0  # EMA weight in [0, 1): 0 draws the values as they are
    show_superseded: bool = False  # what abandoned attempts logged after the resume step, faint


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


def _time_unit(span_s: float) -> tuple[str, float]:
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
) -> tuple[pd.DataFrame, str]:
    """The rows of one metric shaped for ``metric_chart``, and the x axis title.

    Args:
        rows: the store's buckets (attempt, rank, step, last_step, value, min, max, count,
            nan_count, wall_time), raw points being buckets of one step.
        cutoffs: per attempt, the last step on the run's lineage (db.queries.lineage_cutoffs);
            a bucket starting after it is superseded.
        options: what to draw.
        started_at: the run's start (epoch seconds), for the relative time axis.

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
    f["count"] = f["count"] if "count" in f else 1
    nan_count = f["nan_count"] if "nan_count" in f else 0
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
    if options.log_y:  # a log scale cannot show zero or less
        for col in ("value", "lo", "hi", "smooth"):
            f[col] = f[col].where(f[col] > 0)
    title = "step"
    if options.x == X_WALL:
        f["x"] = f["wall_time"] * 1000.0  # epoch milliseconds: Vega's temporal values
        title = "wall time"
    elif options.x == X_RELATIVE:
        start = started_at if started_at is not None else float(f["wall_time"].min())
        unit, div = _time_unit(float(f["wall_time"].max()) - start)
        f["x"] = (f["wall_time"] - start) / div
        title = f"time since start ({unit})"
    else:
        f["x"] = f["step"]
    return f[columns], title


def rank_mean(rows: Sequence[Mapping[str, Any]], cutoffs: Mapping[int, float]) -> pd.DataFrame:
    """The mean over ranks of one metric along the run's lineage: ``step`` and ``value``."""
    frame, _ = series_frame(rows, cutoffs, ChartOptions(ranks=RANK_MEAN))
    lineage = frame[~frame["superseded"]]
    return lineage.groupby("step", as_index=False)["value"].mean()


# -- charts ----------------------------------------------------------------------------------


def _envelope(frame: pd.DataFrame) -> pd.DataFrame:
    """The band under the lines: per attempt and x, the lowest and highest value any rank had
    in the bucket (one band for all ranks: 8 overlapping bands would hide the lines)."""
    return frame.groupby(["attempt", "step"], as_index=False, sort=True).agg(
        x=("x", "max"), lo=("lo", "min"), hi=("hi", "max"))  # ranks' wall times differ a little


def metric_chart(frame: pd.DataFrame, key: str, options: ChartOptions, x_title: str = "step",
                 bucketed: bool = False) -> alt.LayerChart:
    """One metric of one run: lines (per rank, or the rank mean), a faint band from the lowest
    to the highest value any rank logged in each bucket (for the rank mean, or when ``bucketed``:
    spikes survive the downsampling), the EMA strong over the faint values when smoothing,
    superseded steps faint and dashed, and a red rule at every step that logged a NaN.
    """
    temporal = options.x == X_WALL
    x = alt.X("x:T" if temporal else "x:Q", title=x_title,
              scale=alt.Scale(zero=False) if not temporal else alt.Undefined)
    y_scale = alt.Scale(type="log") if options.log_y else alt.Scale(zero=False)
    mean = options.ranks == RANK_MEAN
    smoothing = options.smoothing > 0

    def color(legend: bool) -> Any:  # one legend, from the strong line (not the faint layers)
        if mean:
            return alt.value(MEAN_COLOR)
        return alt.Color("rank:N", title="rank", legend=alt.Legend() if legend else None)

    # Few tooltip fields, unformatted: Vega evaluates them for every row when it draws.
    tooltip = ["rank:N", "step:Q", "value:Q"]
    # Separate data for the lineage and the superseded steps rather than filter transforms:
    # Streamlit's Vega runs expressions through an interpreter, per row and per layer.
    lineage = alt.Chart(frame[~frame["superseded"]]).encode(x=x, detail="series:N")

    layers: list[alt.Chart] = []
    if bucketed or mean:
        band = alt.Chart(_envelope(frame[~frame["superseded"]]))
        layers.append(band.mark_area(opacity=0.15, color=BAND_COLOR if not mean else MEAN_COLOR).encode(
            x=x, y=alt.Y("lo:Q", scale=y_scale, title=key), y2="hi:Q", detail="attempt:N"))
    few = len(frame) < POINTS_BELOW
    layers.append(lineage.mark_line(point=few and not smoothing, opacity=0.3 if smoothing else 1.0).encode(
        y=alt.Y("value:Q", scale=y_scale, title=key), color=color(not smoothing), tooltip=tooltip))
    if smoothing:
        layers.append(lineage.mark_line(strokeWidth=2).encode(
            y=alt.Y("smooth:Q", scale=y_scale, title=key), color=color(True),
            tooltip=[*tooltip, alt.Tooltip("smooth:Q", title="smoothed")]))
    if options.show_superseded and bool(frame["superseded"].any()):
        layers.append(alt.Chart(frame[frame["superseded"]]).mark_line(opacity=0.35, strokeDash=[4, 3]).encode(
            x=x, y=alt.Y("value:Q", scale=y_scale), color=color(False), detail="series:N", tooltip=tooltip))
    nans = frame[frame["nan"] & (options.show_superseded | ~frame["superseded"])]
    if not nans.empty:
        marks = nans.groupby("x", as_index=False).agg(
            step=("step", "min"), ranks=("rank", lambda r: ", ".join(sorted(set(r)))))
        layers.append(alt.Chart(marks).mark_rule(color=NAN_COLOR, strokeDash=[2, 2], opacity=0.7).encode(
            x=x, tooltip=[alt.Tooltip("step:Q", title="NaN at step"), alt.Tooltip("ranks:N", title="rank")]))
    return alt.layer(*layers, title=key).properties(height=260)


def attempt_timeline(attempts: pd.DataFrame) -> alt.Chart:
    """One bar per attempt from launch to end, coloured by how it ended."""
    return (
        alt.Chart(attempts, title="attempts")
        .mark_bar(cornerRadius=3, height=18)
        .encode(
            x=alt.X("start:T", title="time"),
            x2="end:T",
            y=alt.Y("attempt:O", title="attempt"),
            color=alt.Color("outcome:N", title="ended", scale=alt.Scale(
                domain=["SUCCEEDED", "RUNNING", "PAUSED", "CANCELLED", "PREEMPTED", "FAILED"],
                range=["#2ca02c", "#1f77b4", "#9467bd", "#7f7f7f", "#ff7f0e", "#d62728"])),
            tooltip=["attempt", "outcome", "cause", "steps", "reason"],
        )
        .properties(height=40 + 26 * len(attempts))
    )


def runs_overlay(frame: pd.DataFrame, key: str, log_y: bool = False) -> alt.Chart:
    """One line per run (the mean over its ranks) of one metric against the step."""
    scale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    data = frame[frame["value"] > 0] if log_y else frame
    return (
        alt.Chart(data, title=f"{key}, mean over ranks")
        .mark_line()
        .encode(
            x=alt.X("step:Q", title="step"),
            y=alt.Y("value:Q", title=key, scale=scale),
            color=alt.Color("run:N", title="run", legend=alt.Legend(labelLimit=400)),  # whole run names
            tooltip=["run", "step", alt.Tooltip("value:Q", format=".4~g")],
        )
        .properties(height=360)
    )
