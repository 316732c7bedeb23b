"""The Compare page's shapes: one colour per run, the summary and config-diff tables, and one
overlay chart per metric (the runs' rank means along their lineages).

A run keeps its colour on every chart and in the tables: colours go by the run's place in the
chosen list (``PALETTE``, ten hues apart from each other, none pale; the page allows ten runs).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import pandas as pd
from pandas.io.formats.style import Styler

from app.charts.metric import X_RELATIVE, X_STEP, X_WALL, ema, spans_decades, time_unit
from db.compare import ABSENT, MAX_RUNS, MetricSummary, higher_is_better
from db.vocabulary import metric_registry
from orchestrator.cost_text import energy_short
from orchestrator.format import duration, note_line, step_text, usd

# Vega's category10 hues: blue, orange, green, red, purple, brown, pink, grey, olive, cyan.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
assert len(PALETTE) >= MAX_RUNS, "one colour per run the Compare page takes"
SWATCH = "●"
MISSING = "—"  # a run without the metric


def run_label(run: Mapping[str, Any]) -> str:
    """How a run is named in the legends and tables: ``#12 lr-high (SUCCEEDED)``."""
    return f"#{run['id']} {run['name']} ({run['status']})"


def run_colors(run_ids: Sequence[int]) -> dict[int, str]:
    """Each run's colour, by its place in ``run_ids`` (at most ``MAX_RUNS``)."""
    return {run_id: PALETTE[i % len(PALETTE)] for i, run_id in enumerate(run_ids)}


def where(m: MetricSummary) -> str:
    """Where the best value lies: its step, or for a long run the bucket of steps it is the mean of."""
    if m.bucket_steps == 1 or m.best_last_step == m.best_step:
        return str(m.best_step)
    return f"{m.best_step}–{m.best_last_step}"


def best_word(higher: bool) -> str:
    return "max" if higher else "min"


def summary_frame(runs: Sequence[Mapping[str, Any]], keys: Sequence[str],
                  metrics: Mapping[tuple[int, str], MetricSummary]) -> pd.DataFrame:
    """One row per run: its swatch, label, status, steps, wall time, tags, note (its first line), and per metric the
    final value and the best (``min`` or ``max`` in the column name) with its step, titled and
    formatted by the metric registry (``Eval accuracy (%) final``: ``87.5``)."""
    rows = []
    for run in runs:
        row: dict[str, Any] = {
            "": SWATCH, "run": f"#{run['id']} {run['name']}", "status": run["status"],
            "steps": step_text(run["step"], run["max_steps"]), "wall time": duration(run["elapsed_s"]),
            "tags": ", ".join(run["tags"]) or MISSING,
            "note": note_line(run["note"]) or MISSING,
        }
        for key in keys:
            m = metrics.get((run["id"], key))
            title = metric_registry.axis_title(key)
            row[f"{title} final"] = metric_registry.format_number(key, m.final) if m else MISSING
            best = f"{title} best ({best_word(higher_is_better(key))})"
            row[best] = (f"{metric_registry.format_number(key, m.best)} @ {where(m)}" if m and m.best is not None
                         else MISSING)
        rows.append(row)
    return pd.DataFrame(rows)


def cost_frame(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run: its swatch, label, energy, and its two cost lines in columns of their own,
    never added (docs/COSTS.md): your cost and the cloud reference, each with its wasted part."""
    def line(cost: Mapping[str, Any]) -> str:
        return f"{usd(cost['usd'])}, wasted {usd(cost['wasted_usd'])}" if cost["usd"] is not None else MISSING

    return pd.DataFrame([{"": SWATCH, "run": f"#{run['id']} {run['name']}",
                          "energy": energy_short(run.get("energy"), MISSING), "your cost": line(run["cost"]["yours"]),
                          "cloud ref.": line(run["cost"]["cloud_reference"])} for run in runs])


def styled_summary(frame: pd.DataFrame, colors: Sequence[str]) -> Styler:
    """The summary with each run's swatch in its colour (row i in ``colors[i]``)."""
    def paint(column: pd.Series) -> list[str]:
        return [f"color: {c}; font-size: 1.3em" for c in colors]

    return frame.style.apply(paint, subset=[""]).hide(axis="index")


def config_value(value: Any) -> str:
    """A config value as the diff shows it: JSON for lists, dicts, booleans and None."""
    if value is ABSENT:
        return "(not set)"
    return value if isinstance(value, str) else json.dumps(value)


def diff_frame(diff: Sequence[tuple[str, list[Any]]], labels: Sequence[str]) -> pd.DataFrame:
    """The config diff as a table: one row per key (``section.key``), one column per run."""
    return pd.DataFrame([[key, *(config_value(v) for v in values)] for key, values in diff],
                        columns=["key", *labels])


def rank_mean(rows: Sequence[Mapping[str, Any]], cutoffs: Mapping[int, float]) -> pd.DataFrame:
    """The mean over ranks of one metric at each step along the run's lineage (a bucket that
    starts after its attempt's cutoff was abandoned by a resume): ``step``, ``value`` and
    ``wall_time`` (the latest rank's, for a time axis)."""
    frame = pd.DataFrame.from_records(rows, columns=["attempt", "rank", "step", "value", "wall_time"])
    if frame.empty:
        return pd.DataFrame({"step": pd.Series(dtype=int), "value": pd.Series(dtype=float),
                             "wall_time": pd.Series(dtype=float)})
    on_lineage = frame["step"] <= frame["attempt"].map(lambda a: cutoffs.get(a, math.inf))
    return frame[on_lineage].groupby("step", as_index=False).agg(value=("value", "mean"),
                                                                 wall_time=("wall_time", "max"))


def placed(mean: pd.DataFrame, x_axis: str, started_at: float | None, smoothing: float) -> pd.DataFrame:
    """One run's rank mean with its ``x`` (the step, the epoch milliseconds of ``wall time``, or
    seconds since the run started for ``relative time``: divided to a unit by
    :func:`relative_x`) and ``smooth``: the Run page's EMA (app.charts.metric.ema) at weight
    ``smoothing``, NaN without smoothing."""
    frame = mean.sort_values("step", kind="stable").reset_index(drop=True)
    if x_axis == X_WALL:
        x = frame["wall_time"] * 1000.0
    elif x_axis == X_RELATIVE:
        start = started_at if started_at is not None else (float(frame["wall_time"].min()) if len(frame) else 0.0)
        x = frame["wall_time"] - start
    else:
        x = frame["step"].astype(float)
    smooth = ema(frame["value"], smoothing) if smoothing > 0 else pd.Series(math.nan, index=frame.index)
    return frame.assign(x=x, smooth=smooth)


def relative_x(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The seconds since each run's start in the unit the longest run reads best in, and the axis title."""
    unit, seconds = time_unit(float(frame["x"].max()) if len(frame) else 0.0)
    return frame.assign(x=frame["x"] / seconds), f"time since start ({unit})"


def log_by_rule(key: str, frame: pd.DataFrame) -> bool:
    """Whether ``key``'s chart opens on a log y axis: the Run page's rule (app.charts.metric:
    a metric a log axis suits whose values span more than two decades, over every run's line)."""
    return metric_registry.spec_for(key).log_ok and spans_decades([{"value": v} for v in frame["value"].tolist()])


def legend_html(labels: Sequence[str], colors: Sequence[str]) -> str:
    """One legend for all the charts: a swatch in each run's colour before its label (escaped for
    HTML: a run's name is the person's text; Markdown is not read inside this HTML block, so
    Markdown escapes would show as typed)."""
    items = [f'<span class="runyard-run" style="white-space: nowrap; margin-right: 1.2em">'
             f'<span style="color: {color}; font-size: 1.3em">{SWATCH}</span> {html.escape(label)}</span>'
             for label, color in zip(labels, colors, strict=True)]
    return '<div class="runyard-legend">' + " ".join(items) + "</div>"


def overlay_chart(frame: pd.DataFrame, key: str, labels: Sequence[str], colors: Sequence[str],
                  log_y: bool = False, x_axis: str = X_STEP, x_title: str = "step",
                  smoothing: bool = False) -> alt.LayerChart:
    """One metric of several runs: a line per run (``run``, ``x``, ``step``, ``value``, ``smooth``
    columns), each in its run's colour whichever runs have the metric (the scale lists every
    chosen run); with ``smoothing``, the values faint and the EMA strong over them, as on the Run
    page."""
    scale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    data = frame.assign(smooth=frame["smooth"].where(frame["smooth"] > 0)) if log_y else frame
    data = data[data["value"] > 0] if log_y else data  # a log scale cannot show zero or less
    # In its displayed unit, each run's series by itself (one may have logged a share in percent).
    factor = data.groupby("run")["value"].transform(lambda v: metric_registry.display_scale(key, v.tolist()))
    data = data.assign(value=data["value"] * factor, smooth=data["smooth"] * factor)
    y_title = f"{metric_registry.axis_title(key)}, mean over ranks"
    x = alt.X("x:T", title=x_title) if x_axis == X_WALL else alt.X("x:Q", title=x_title)
    # No legend on each chart: one for the section (legend_html) leaves every plot its whole
    # width and height, however narrow the column.
    color = alt.Color("run:N", scale=alt.Scale(domain=list(labels), range=list(colors)), legend=None)
    tooltip = ["run", "step", alt.Tooltip("value:Q", format=".4~g")]
    base = alt.Chart(data, title=metric_registry.label(key))
    values = base.mark_line(point=len(data) < 60 and not smoothing, opacity=0.25 if smoothing else 1.0).encode(
        x=x, y=alt.Y("value:Q", title=y_title, scale=scale), color=color, tooltip=tooltip)
    layers = [values]
    if smoothing:
        layers.append(base.mark_line().encode(
            x=x, y=alt.Y("smooth:Q", title=y_title, scale=scale), color=color,
            tooltip=[*tooltip, alt.Tooltip("smooth:Q", title="smoothed", format=".4~g")]))
    return alt.layer(*layers).properties(height=300)
