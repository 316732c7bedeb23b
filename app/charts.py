"""Chart builders: plain functions from DataFrames to Altair charts."""

from __future__ import annotations

import altair as alt
import pandas as pd


def per_rank_line(frame: pd.DataFrame, key: str, log_y: bool = False, show_superseded: bool = False) -> alt.LayerChart:
    """One line per rank of one metric against the step, along the run's lineage.

    Points that an abandoned attempt logged after the step the run was resumed from are
    superseded: hidden, or drawn faint and dashed when ``show_superseded``.
    """
    data = frame.assign(rank=frame["rank"].astype(str), series=frame["rank"].astype(str) + "/" + frame["attempt"].astype(str))
    scale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    lineage = data[~data["superseded"]] if "superseded" in data else data
    base = alt.Chart(lineage, title=key).encode(
        x=alt.X("step:Q", title="step"),
        y=alt.Y("value:Q", title=key, scale=scale),
        color=alt.Color("rank:N", title="rank"),
        detail="series:N",
        tooltip=["rank", "step", "value", "attempt"],
    )
    layers = [base.mark_line(point=len(lineage) < 60)]
    if show_superseded and "superseded" in data and data["superseded"].any():
        old = alt.Chart(data[data["superseded"]]).mark_line(opacity=0.35, strokeDash=[4, 3]).encode(
            x="step:Q", y=alt.Y("value:Q", scale=scale), color=alt.Color("rank:N"), detail="series:N",
            tooltip=["rank", "step", "value", "attempt"],
        )
        layers.append(old)
    return alt.layer(*layers).properties(height=260)


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
                domain=["SUCCEEDED", "RUNNING", "CANCELLED", "PREEMPTED", "FAILED"],
                range=["#2ca02c", "#1f77b4", "#7f7f7f", "#ff7f0e", "#d62728"])),
            tooltip=["attempt", "outcome", "cause", "steps", "reason"],
        )
        .properties(height=40 + 26 * len(attempts))
    )


def runs_overlay(frame: pd.DataFrame, key: str, log_y: bool = False) -> alt.Chart:
    """One line per run (the mean over its ranks) of one metric against the step."""
    scale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    return (
        alt.Chart(frame, title=f"{key}, mean over ranks")
        .mark_line()
        .encode(
            x=alt.X("step:Q", title="step"),
            y=alt.Y("value:Q", title=key, scale=scale),
            color=alt.Color("run:N", title="run"),
            tooltip=["run", "step", "value"],
        )
        .properties(height=360)
    )
