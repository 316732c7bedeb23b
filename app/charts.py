"""Chart builders: plain functions from DataFrames to Altair charts."""

from __future__ import annotations

import altair as alt
import pandas as pd


def per_rank_line(frame: pd.DataFrame, key: str, log_y: bool = False) -> alt.Chart:
    """One line per rank of one metric against the step."""
    data = frame.assign(rank=frame["rank"].astype(str))
    scale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    return (
        alt.Chart(data, title=key)
        .mark_line(point=len(data) < 60)
        .encode(
            x=alt.X("step:Q", title="step"),
            y=alt.Y("value:Q", title=key, scale=scale),
            color=alt.Color("rank:N", title="rank"),
            tooltip=["rank", "step", "value", "attempt"],
        )
        .properties(height=260)
    )
