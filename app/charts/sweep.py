"""The sweep page's Altair charts, from the plain trials db/sweeps/queries.py gives: parameter
importance as bars, the objective against each parameter (small multiples), the best value so
far over trials and over GPU time, and the trials' curves of the sweep's metric on one chart,
each trial coloured by its objective (the parallel coordinates' colours, app/charts/parallel.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import pandas as pd

from app.charts.parallel import VIRIDIS, objective_colors

STATE_COLORS = {"SUCCEEDED": "#2ca02c", "PRUNED": "#9467bd", "RUNNING": "#1f77b4", "FAILED": "#d62728"}
OTHER_COLOR = "#7f7f7f"
SMALL = 180  # a small multiple's height and width, in pixels


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def importance_chart(shares: Mapping[str, float]) -> alt.Chart:
    """Each key's share of the importance, largest first."""
    frame = pd.DataFrame({"key": list(shares), "share": list(shares.values())})
    chart: alt.Chart = (alt.Chart(frame, title="Parameter importance")
            .mark_bar(color="#1f77b4")
            .encode(y=alt.Y("key:N", sort="-x", title=None),
                    x=alt.X("share:Q", title="share of the importance", axis=alt.Axis(format="%"),
                            scale=alt.Scale(domain=[0, 1])),
                    tooltip=["key", alt.Tooltip("share:Q", format=".1%")])
            .properties(height=max(60, 28 * len(frame))))
    return chart


def _state(status: str) -> str:
    return status if status in STATE_COLORS else "other"


def trials_frame(trials: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> pd.DataFrame:
    """One row per trial with a value: ``trial``, ``state``, ``value`` and each key's setting."""
    rows = [{"trial": t["number"], "state": _state(t["status"]), "value": t["value"],
             **{k: t["params"].get(k) for k in keys}} for t in trials if _finite(t["value"])]
    return pd.DataFrame(rows, columns=["trial", "state", "value", *keys])


def _state_color() -> alt.Color:
    states = [*STATE_COLORS, "other"]
    return alt.Color("state:N", scale=alt.Scale(domain=states, range=[*STATE_COLORS.values(), OTHER_COLOR]),
                     title="state")


def objective_by_param_chart(trials: Sequence[Mapping[str, Any]], space: Mapping[str, Mapping[str, Any]],
                             metric: str) -> alt.ConcatChart:
    """The objective against each key of the space, one small chart per key (a log axis for a
    ``log_uniform`` key, the choices as categories), a dot per trial in its state's colour."""
    keys = list(space)
    frame = trials_frame(trials, keys)
    charts = []
    for key in keys:
        dim = space[key]
        field = key.replace(".", "\\.")  # a dot in a field name is a nested field to Vega
        if dim.get("choice") is not None:
            x = alt.X(f"{field}:N", title=key, sort=[str(c) for c in dim["choice"]])
            part = frame.assign(**{key: frame[key].map(str)})
        else:
            scale = alt.Scale(type="log") if dim.get("log_uniform") is not None else alt.Scale(zero=False)
            x = alt.X(f"{field}:Q", title=key, scale=scale)
            part = frame
        charts.append(alt.Chart(part).mark_circle(size=60, opacity=0.8).encode(
            x=x, y=alt.Y("value:Q", title=metric, scale=alt.Scale(zero=False)), color=_state_color(),
            tooltip=["trial", "state", alt.Tooltip(f"{field}:N", title=key), alt.Tooltip("value:Q", format=".4~g")],
        ).properties(width=SMALL, height=SMALL))
    return alt.concat(*charts, columns=3, title=f"{metric} against each parameter")


def best_so_far(trials: Sequence[Mapping[str, Any]], goal: str) -> pd.DataFrame:
    """The best objective of the trials that finished, up to each trial (by number), and the
    GPU-hours spent by the trials up to it: ``trial``, ``gpu_hours``, ``value`` (the trial's
    own, or NaN), ``best`` (NaN before the first finished trial)."""
    best = math.nan
    spent = 0.0
    rows = []
    for t in sorted(trials, key=lambda t: t["number"]):
        spent += t["gpu_hours"]
        value = t["objective"] if _finite(t["objective"]) else math.nan
        if not math.isnan(value) and (math.isnan(best) or (value > best if goal == "maximize" else value < best)):
            best = value
        rows.append({"trial": t["number"], "gpu_hours": spent, "value": value, "best": best})
    return pd.DataFrame(rows, columns=["trial", "gpu_hours", "value", "best"])


def best_so_far_chart(frame: pd.DataFrame, metric: str) -> alt.HConcatChart:
    """Two panels: the best so far (a step line) with each finished trial's value (dots), over the
    trial number and over the GPU-hours spent."""
    def panel(x: str, title: str) -> alt.LayerChart:
        base = alt.Chart(frame).encode(x=alt.X(f"{x}:Q", title=title))
        line = base.mark_line(interpolate="step-after", color="#ff7f0e").encode(
            y=alt.Y("best:Q", title=f"best {metric} so far", scale=alt.Scale(zero=False)),
            tooltip=["trial", alt.Tooltip("best:Q", format=".4~g")])
        dots = base.mark_circle(size=40, color="#1f77b4", opacity=0.7).encode(
            y=alt.Y("value:Q", title=f"best {metric} so far"), tooltip=["trial", alt.Tooltip("value:Q", format=".4~g")])
        layered: alt.LayerChart = alt.layer(line, dots).properties(width=320, height=220)
        return layered

    return alt.hconcat(panel("trial", "trial"), panel("gpu_hours", "GPU-hours spent (trials up to this one)"),
                       title=f"Best {metric} so far")


def curve_rows(rows: Sequence[Mapping[str, Any]], ranks: str) -> list[tuple[int, float]]:
    """One trial's metric as (step, value): rank 0's (``ranks = "rank0"``) or the mean over the
    ranks at each step (``"mean"``), the newest attempt's where a retry logged a step again (as
    the objective reads it, orchestrator/sweeps/objective.py); NaN left out."""
    newest: dict[int, int] = {}
    for r in rows:
        newest[r["step"]] = max(newest.get(r["step"], r["attempt"]), r["attempt"])
    by_step: dict[int, list[float]] = {}
    for r in rows:
        if r["attempt"] != newest[r["step"]] or (ranks != "mean" and r["rank"] != 0) or not _finite(r["value"]):
            continue
        by_step.setdefault(r["step"], []).append(r["value"])
    return [(step, sum(v) / len(v)) for step, v in sorted(by_step.items())]


def curves_frame(curves: Mapping[int, Sequence[tuple[int, float]]], trials: Sequence[Mapping[str, Any]],
                 goal: str) -> pd.DataFrame:
    """Every trial's curve in one frame: ``trial``, ``step``, ``value``, ``color`` (its
    objective's colour)."""
    colors = dict(zip([t["number"] for t in trials], objective_colors([t["value"] for t in trials], goal),
                      strict=True))
    rows = [{"trial": number, "step": step, "value": value, "color": colors.get(number, VIRIDIS[0])}
            for number, points in curves.items() for step, value in points]
    return pd.DataFrame(rows, columns=["trial", "step", "value", "color"])


def curves_chart(frame: pd.DataFrame, metric: str, rungs: Sequence[int]) -> alt.LayerChart:
    """The trials' curves on one chart, each in its colour, with a rule at each rung's step."""
    lines = alt.Chart(frame).mark_line(
        strokeWidth=1.4, opacity=0.8).encode(
        x=alt.X("step:Q", title="step"), y=alt.Y("value:Q", title=metric, scale=alt.Scale(zero=False)),
        detail="trial:N", color=alt.Color("color:N", scale=None),
        tooltip=["trial", "step", alt.Tooltip("value:Q", format=".4~g")])
    rules = alt.Chart(pd.DataFrame({"step": list(rungs)})).mark_rule(strokeDash=[4, 4], color=OTHER_COLOR).encode(
        x="step:Q", tooltip=[alt.Tooltip("step:Q", title="rung at step")])
    chart: alt.LayerChart = alt.layer(lines, rules, title=f"{metric} of every trial, coloured by its objective"
                                      ).properties(height=320)
    return chart
