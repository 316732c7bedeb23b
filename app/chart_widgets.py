"""The Run page's metric section around the charts: the rank legend strip that isolates ranks,
the charts with the box zoom they share, and the table of each metric's newest value per rank.
Plain functions called inside the page's live fragment (app/views/run.py's ``metric_charts``).

The box zoom: a drag on a chart draws a box (its ``box`` selection, sent back through
st.altair_chart's on_select); the box becomes the section's zoom (``charts.Zoom``), kept in the
session so that it holds across the live refreshes, and every chart of the section is drawn
with its x range, the y axis fitted to what lies in it (the chart the box was drawn on shows the
box's y range). A double-click on a chart, or Reset zoom, clears it.

The shared cursor: an alt-click (option-click) on a chart marks the step nearest the pointer (its ``pin``
selection); every chart of the section draws a rule and a dot on each line at its own step nearest
that one, and the table under the charts shows every metric's value per rank at the marked step
instead of the newest. Clear mark clears it.

Charts that cannot change are built once for every session of the UI (``st.cache_resource``):
the legend strip of N ranks, and the charts of a run that has ended (its buckets fetched after
the end, ``LiveSeries.final``), keyed by everything they are drawn from; a live run's chart is
built again only when one of its buckets changed. Altair takes 24 ms to build the strip and 75 ms
a metric chart here (8 ranks, 5,000 buckets), paid before by every new tab and every refresh of
the section, against 2.4 ms to hash the buckets."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from app import style
from app.charts import live
from app.charts import metric as charts
from app.live_series import LiveSeries
from db.vocabulary import metric_registry
from orchestrator.format import clock


def isolated_ranks(run_id: int, nproc: int) -> tuple[str, ...]:
    """The section's one rank legend; the ranks clicked in it (none: all shown alike). How to use
    it is the help of the Ranks control above it (app/views/run.py's RANKS_HELP)."""
    if nproc < 2:
        return ()
    event = st.altair_chart(_rank_legend(nproc), on_select="rerun", selection_mode="isolate",
                            key=f"rank-legend-{run_id}", width="stretch")
    return tuple(str(p["rank"]) for p in event.selection.get("isolate", []) if "rank" in p)


@st.cache_resource(max_entries=8, show_spinner=False)
def _rank_legend(nproc: int) -> alt.LayerChart:
    """The legend strip of ``nproc`` ranks: the same for every run of that many ranks."""
    return charts.unvalidated(charts.rank_legend([str(r) for r in range(nproc)]))


def run_chart(d: dict[str, Any], key: str, series: LiveSeries, cutoffs: dict[int, float],
              options: charts.ChartOptions) -> alt.LayerChart:
    """The chart of one metric of the run ``d`` (``charts.metric_view``), built only when what it is
    drawn from changed: shared by every session once the run has ended (``series.final``); for a
    live run, this session's last one is drawn again while no bucket changed (a run whose steps
    take longer than the 2-s refresh, or one that is evaluating, saving or retrying)."""
    build = partial(charts.metric_view, series.rows, cutoffs, options, key, d["started_at"],
                    bucketed=series.level > 0)
    drawn_from = hash((key, options, d["started_at"], series.level, tuple(sorted(cutoffs.items())),
                       len(series.rows), tuple(tuple(row.values()) for row in series.rows)))
    if series.final:
        return _ended_run_chart(drawn_from, build)
    # This session's last chart of each metric, of the run it shows now only (a few MB a run).
    last: dict[tuple[int, str], tuple[int, alt.LayerChart]] = st.session_state.setdefault("last-live-charts", {})
    kept = last.get((d["id"], key))
    if kept is not None and kept[0] == drawn_from:
        return kept[1]
    chart = build()
    # Drawn by the live component (zoomable_chart): sent a refresh at a time while the rows are
    # fetched at this level for these attempts.
    object.__setattr__(chart, "live_generation", f"{series.level}/{series.attempts}")
    for other in [k for k in last if k[0] != d["id"]]:
        del last[other]
    last[(d["id"], key)] = (drawn_from, chart)
    return chart


@st.cache_resource(max_entries=32, show_spinner=False)
def _ended_run_chart(drawn_from: int, _build: Callable[[], alt.LayerChart]) -> alt.LayerChart:
    """``_build()``, once per ``drawn_from`` (the hash of everything the chart is drawn from)."""
    return _build()


def latest_table(latest: dict[str, dict[str, float | None]], keys: list[str], title: str = "Latest value per rank",
                 ) -> None:
    """The newest value of each metric on each rank (or the values at the marked step: ``title``
    says which), with the metric's label, unit and format."""
    shown = [k for k in keys if latest.get(k)]
    if not shown:
        return
    ranks = sorted({r for k in shown for r in latest[k]}, key=lambda r: int(r) if str(r).isdigit() else -1)
    st.markdown(f"**{title}**")
    st.table(style.plain_frame(pd.DataFrame(  # a static table: cheaper for the browser than a data grid; Markdown
        {f"rank {r}": [metric_registry.format_number(k, latest[k].get(r)) for k in shown] for r in ranks},
        index=pd.Index([metric_registry.axis_title(k) for k in shown], name="metric"),
    )))


def zoom_of(run_id: int) -> charts.Zoom | None:
    """The section's box zoom for this run, if a person drew one."""
    zoom = st.session_state.get(f"zoom-{run_id}")
    return zoom if isinstance(zoom, charts.Zoom) else None


def cursor_of(run_id: int) -> int | None:
    """The step a person marked on a chart of this run, if any."""
    step = st.session_state.get(f"cursor-{run_id}")
    return step if isinstance(step, int) else None


def _selected(run_id: int, key: str, chart_key: str, x_axis: str) -> None:
    """A box was drawn on the chart of ``key`` (or cleared by a double-click), or a step was
    alt-clicked on it (on the live component too: its state ``selection`` has the same shape)."""
    event = st.session_state.get(chart_key)
    selection = (event.get("selection") or {}) if event else {}
    box, pin = selection.get("box") or {}, selection.get("pin") or []
    seen = f"seen-{chart_key}"
    old_box, old_pin = st.session_state.get(seen, ({}, []))
    st.session_state[seen] = (box, pin)
    if box != old_box:
        st.session_state[f"zoom-{run_id}"] = charts.Zoom.from_selection(box, key, x_axis)
    step = pin[0].get("step") if pin and isinstance(pin[0], dict) else None
    if pin != old_pin and isinstance(step, (int, float)):
        st.session_state[f"cursor-{run_id}"] = int(step)


def zoomable_chart(run_id: int, key: str, chart: alt.LayerChart, x_axis: str, where: str) -> None:
    """One metric chart whose drawn box zooms, and whose clicked step marks, every chart of the
    section. A live run's chart (``run_chart`` gave it a ``live_generation``) is the live
    component (app/charts/live.py: after the first refresh only the rows that changed are sent);
    an ended run's, st.altair_chart (built once for every session, and sent once per browser:
    Streamlit sends a message the browser already has as a reference)."""
    # A new key after Reset zoom: Streamlit restores a chart's selections by its key, so the box
    # drawn before the reset stayed on the chart (and caught the clicks inside it).
    chart_key = f"chart-{where}-{run_id}-{key}-{st.session_state.get(f'zoom-resets-{run_id}', 0)}"
    generation = getattr(chart, "live_generation", None)
    if isinstance(generation, str):
        live_chart(chart, chart_key, generation, partial(_selected, run_id, key, chart_key, x_axis))
        return
    st.altair_chart(charts.unvalidated(chart), width="stretch", key=chart_key, selection_mode=["box", "pin"],
                    on_select=partial(_selected, run_id, key, chart_key, x_axis))


@st.cache_resource
def _live_component() -> Any:
    """The live chart's component (app/charts/live.py), registered once per process."""
    return st.components.v2.component(live.NAME, html=live.HTML, css=live.CSS, js=live.js_code(), isolate_styles=False)


def live_chart(chart: alt.LayerChart, chart_key: str, generation: str, on_select: Callable[[], None]) -> None:
    """A live run's chart as the live component: the whole chart on the first refresh (or when
    its spec, level or attempts changed), else only the rows that changed since this session's
    browser drew it (``live.refresh``). A browser that could not apply a refresh says which one it
    holds (the trigger ``resync``): the next builds on that one (``live.Sent``)."""
    sent: live.Sent = st.session_state.setdefault(f"live-sent-{chart_key}", live.Sent())

    def resync() -> None:
        state = st.session_state.get(chart_key)
        sent.rewind(state.get("resync") if state else None)

    update, drawn = live.refresh(sent.drawn, chart, generation)
    sent.record(drawn)
    _live_component()(data=update.message(), key=chart_key, default={"selection": None},
                      on_selection_change=on_select, on_resync_change=resync)


def cursor_note(run_id: int, where: str) -> None:
    """While a step is marked: which, and a button that clears it."""
    step = cursor_of(run_id)
    if step is None:
        return
    table = ("the table below shows each metric's value there" if where == "metrics"
             else "the Metrics section's table shows each metric's value there")
    text, button = st.columns([5, 1], vertical_alignment="center")
    text.caption(f"Step {step:,} marked on every chart; {table}. "
                 "Alt-click (option-click) another step to move the mark.")
    if button.button("Clear mark", key=f"cursor-clear-{where}-{run_id}", icon=":material/close:"):
        st.session_state[f"cursor-{run_id}"] = None
        st.rerun(scope="fragment")


def values_at(rows: list[dict[str, Any]], cutoffs: dict[int, float], step: int) -> dict[str, float | None]:
    """Each rank's value of one metric at its logged step nearest ``step`` (the run's lineage:
    not what an abandoned attempt logged after the step it was resumed from)."""
    frame = charts.series_frame(rows, cutoffs, charts.ChartOptions(ranks=charts.PER_RANK))[0]
    lineage = frame[~frame["superseded"]]
    at = charts.nearest_step(lineage["step"], step)
    if at is None:
        return {}
    here = lineage[lineage["step"] == at].drop_duplicates("rank", keep="last")
    return {str(r): (None if pd.isna(v) else float(v)) for r, v in zip(here["rank"], here["value"], strict=True)}


def zoom_note(run_id: int, x_title: str) -> None:
    """While the section is zoomed: to which range, and a button that resets it."""
    zoom = zoom_of(run_id)
    if zoom is None:
        return
    text, button = st.columns([5, 1], vertical_alignment="center")
    ends = [clock(v / 1000.0) if x_title == charts.X_WALL else f"{v:,.6g}" for v in zoom.x]  # wall time: epoch ms
    text.caption(f"Zoomed to {x_title} {ends[0]}–{ends[1]} (the box drawn on "
                 f"{style.plain(metric_registry.label(zoom.key))}); double-click a chart to reset.")
    if button.button("Reset zoom", key=f"zoom-reset-{run_id}", icon=":material/zoom_out_map:"):
        st.session_state[f"zoom-{run_id}"] = None
        st.session_state[f"zoom-resets-{run_id}"] = st.session_state.get(f"zoom-resets-{run_id}", 0) + 1
        st.rerun(scope="fragment")
