"""The Run page's metric section around the charts: the rank legend strip that isolates ranks,
and the table of each metric's newest value per rank. Plain functions called inside the page's
live fragment (app/views/run.py's ``metric_charts``)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import charts, style
from db import metric_registry


def isolated_ranks(run_id: int, nproc: int) -> tuple[str, ...]:
    """The section's one rank legend; the ranks clicked in it (none: all shown alike). How to use
    it is the help of the Ranks control above it (app/views/run.py's RANKS_HELP)."""
    if nproc < 2:
        return ()
    event = st.altair_chart(charts.rank_legend([str(r) for r in range(nproc)]), on_select="rerun",
                            selection_mode="isolate", key=f"rank-legend-{run_id}", width="stretch")
    return tuple(str(p["rank"]) for p in event.selection.get("isolate", []) if "rank" in p)


def latest_table(latest: dict[str, dict[str, float | None]], keys: list[str]) -> None:
    """The newest value of each metric on each rank, with the metric's label, unit and format."""
    shown = [k for k in keys if latest.get(k)]
    if not shown:
        return
    ranks = sorted({r for k in shown for r in latest[k]}, key=lambda r: int(r) if str(r).isdigit() else -1)
    st.markdown("**Latest value per rank**")
    st.table(style.plain_frame(pd.DataFrame(  # a static table: cheaper for the browser than a data grid; Markdown
        {f"rank {r}": [metric_registry.format_number(k, latest[k].get(r)) for k in shown] for r in ranks},
        index=pd.Index([metric_registry.axis_title(k) for k in shown], name="metric"),
    )))
