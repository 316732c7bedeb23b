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
    starts after its attempt's cutoff was abandoned by a resume): ``step`` and ``value``."""
    frame = pd.DataFrame.from_records(rows, columns=["attempt", "rank", "step", "value"])
    if frame.empty:
        return pd.DataFrame({"step": pd.Series(dtype=int), "value": pd.Series(dtype=float)})
    on_lineage = frame["step"] <= frame["attempt"].map(lambda a: cutoffs.get(a, math.inf))
    return frame[on_lineage].groupby("step", as_index=False)["value"].mean()


def legend_html(labels: Sequence[str], colors: Sequence[str]) -> str:
    """One legend for all the charts: a swatch in each run's colour before its label (escaped for
    HTML: a run's name is the person's text; Markdown is not read inside this HTML block, so
    Markdown escapes would show as typed)."""
    items = [f'<span class="runyard-run" style="white-space: nowrap; margin-right: 1.2em">'
             f'<span style="color: {color}; font-size: 1.3em">{SWATCH}</span> {html.escape(label)}</span>'
             for label, color in zip(labels, colors, strict=True)]
    return '<div class="runyard-legend">' + " ".join(items) + "</div>"


def overlay_chart(frame: pd.DataFrame, key: str, labels: Sequence[str], colors: Sequence[str],
                  log_y: bool = False) -> alt.Chart:
    """One metric of several runs: a line per run (``run``, ``step``, ``value`` columns), each in
    its run's colour whichever runs have the metric (the scale lists every chosen run)."""
    scale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    data = frame[frame["value"] > 0] if log_y else frame  # a log scale cannot show zero or less
    # In its displayed unit, each run's series by itself (one may have logged a share in percent).
    factor = data.groupby("run")["value"].transform(lambda v: metric_registry.display_scale(key, v.tolist()))
    data = data.assign(value=data["value"] * factor)
    return (
        alt.Chart(data, title=metric_registry.label(key))
        .mark_line(point=len(data) < 60)
        .encode(
            x=alt.X("step:Q", title="step"),
            y=alt.Y("value:Q", title=f"{metric_registry.axis_title(key)}, mean over ranks", scale=scale),
            # No legend on each chart: one for the section (legend_html) leaves every plot its
            # whole width and height, however narrow the column.
            color=alt.Color("run:N", scale=alt.Scale(domain=list(labels), range=list(colors)), legend=None),
            tooltip=["run", "step", alt.Tooltip("value:Q", format=".4~g")],
        )
        .properties(height=300)
    )
