"""The Run page's Overview curves: the loss and the headline metric until the person pins others
("Pin curves"); the pins are the person's layout (app/panels/layout.py), kept across browser
sessions and for every run (a run without any of the pinned metrics shows the defaults; with every
curve unpinned, none and a line saying how to pin some)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import streamlit as st

from app.charts import metric as charts
from app.live_series import LiveSeries
from app.panels import layout as panel_layout
from app.panels.metrics import drawing, log_defaults, waiting
from app.panels.sections import overview_keys
from db.vocabulary import metric_registry


def shown_keys(keys: list[str]) -> list[str]:
    """The curves on the Overview: the person's pins this run has, else the defaults."""
    return overview_keys(keys, panel_layout.current().pinned)


def pinned_after(before: tuple[str, ...] | None, keys: list[str], chosen: list[str]) -> list[str]:
    """The person's pins once they chose ``chosen`` among this run's ``keys``: their pins of
    metrics this run does not have are kept (for the runs that have them)."""
    return [k for k in before or () if k not in keys] + chosen


def _pin(widget: str, keys: list[str]) -> None:
    chosen = list(st.session_state.get(widget) or [])
    panel_layout.update(lambda layout: replace(layout, pinned=tuple(pinned_after(layout.pinned, keys, chosen))))


def overview_charts(d: dict[str, Any], keys: list[str], series: dict[str, LiveSeries]) -> None:
    """The main curves (``series``: those of :func:`shown_keys`), side by side under the badges,
    drawn as the Metrics section draws them (its chosen options for this run, if any)."""
    if not keys:
        waiting(d)  # what the run is doing until its first metrics
        return
    saved = st.session_state.get("chart-options", {}).get(d["id"])
    options = saved or charts.ChartOptions(ranks=charts.default_rank_mode(d["nproc"]))
    if not st.session_state.get(f"log-chosen-{d['id']}"):  # the log axes as the Metrics section has them
        options = replace(options, log_keys=log_defaults(series))
    here = drawing(d, options, "overview")
    cols = st.columns(2)
    for i, (key, s) in enumerate(series.items()):
        with cols[i % 2]:
            here.chart(key, s)
    if not series:  # every curve unpinned
        st.caption("No curves pinned: choose some in **Pin curves** below; every curve is on the **Metrics** "
                   "section.")
    widget = f"pin-{d['id']}"
    st.popover("Pin curves", icon=":material/push_pin:").pills(
        "Curves on the Overview", keys, selection_mode="multi", default=list(series), format_func=metric_registry.label,
        key=widget, on_change=_pin, args=(widget, keys),
        help="Every curve is on the Metrics section; these are the ones shown here, on every run that has them "
             "(kept for you across sessions)")
