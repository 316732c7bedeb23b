"""The Run page's Metrics section: the options above the charts, then the charts in sections by
prefix (app/panels/sections.py), each a collapsible expander titled with its chart count, its
charts two a row, each with a control that opens it alone at the section's full width (and back).
Which sections are open and which chart is full width are the person's layout
(app/panels/layout.py), kept across browser sessions.

Only what is drawn is fetched: a closed section draws nothing and asks the metric store for
nothing, an open one its first charts until "Show all", and each drawn chart's series is merged
with what this session already holds (app.live_series.merge_series): a run with 200 metric names
draws and fetches a dozen charts (MLflow #24012)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import streamlit as st

from app import chart_widgets, data, style
from app.charts import metric as charts
from app.live_series import LiveSeries, merge_series
from app.panels import layout as panel_layout
from app.panels.sections import HIDDEN, Section, chart_order, drawn, drawn_keys, opened, sections
from db.states import TERMINAL_VALUES
from db.vocabulary import metric_registry
from orchestrator.format import startup_text

# Buckets per (attempt, rank) a chart asks for: about 8000 rows a chart whatever the rank count,
# between 500 and 2000 a line (the store halves resolution in steps of 4, so 1/4 to all of it).
CHART_ROWS, MIN_POINTS, MAX_POINTS = 8000, 500, 2000
RANKS_HELP = ("Per rank: a line per rank; mean: the ranks' mean with its min-max band. Click a rank in the strip "
              "below to isolate it on every chart (shift-click adds one, double-click shows all). Hover a chart for "
              "every rank's value at a step; scroll or pinch to zoom the x axis, drag a box to zoom every chart to "
              "it, shift-drag to pan, double-click to reset; alt-click (option-click) a step to mark it on every "
              "chart.")


def max_points(nproc: int) -> int:
    return max(MIN_POINTS, min(MAX_POINTS, CHART_ROWS // max(1, nproc)))


def run_keys(run_id: int) -> list[str]:
    """The run's metric names in chart order, without those that are no chart (``HIDDEN``: ``epoch``)."""
    return [k for k in chart_order(data.metric_keys(run_id)) if k not in HIDDEN]


def live_series(d: dict[str, Any], keys: list[str]) -> dict[str, LiveSeries]:
    """The metrics ``keys`` of the run (the drawn charts only), each merged with what this session
    already holds (only new buckets are fetched), in the order given."""
    newest = d["attempts"][-1] if d["attempts"] else {"number": 0, "resume_step": 0}
    points = max_points(d["nproc"])
    out = {}
    for key in keys:
        state_key = f"live-series/{d['id']}/{key}"
        out[key] = st.session_state[state_key] = merge_series(
            st.session_state.get(state_key),
            partial(data.metric_series, d["id"], key, points),
            max_points=points, attempts=len(d["attempts"]), newest_attempt=newest["number"],
            resume_step=newest["resume_step"] or 0, finished=d["status"] in TERMINAL_VALUES,
        )
    return out


@dataclass(frozen=True)
class Plan:
    """What the Metrics section shows of a run: its metric names, their sections, which are open,
    and the charts drawn (the only series fetched)."""

    keys: list[str]
    sections: list[Section]
    open: dict[str, bool]
    full: str | None
    shown_all: frozenset[str]
    drawn: list[str]


def _section_key(run_id: int, section: str) -> str:
    return f"section-{run_id}-{section}"


def plan(run_id: int) -> Plan:
    """The sections of the run's metrics as the person left them (an expander's state this session,
    else their stored layout, else the defaults) and the charts that will be drawn."""
    keys = run_keys(run_id)
    found = sections(keys)
    layout = panel_layout.current()
    default = opened(found, layout.sections)
    open_now = {s: bool(st.session_state.get(_section_key(run_id, s), o)) for s, o in default.items()}
    shown_all = frozenset(st.session_state.get(f"shown-all-{run_id}", ()))
    return Plan(keys, found, open_now, layout.full, shown_all, drawn_keys(found, open_now, layout.full, shown_all))


def chart_options(run_id: int, nproc: int, keys: list[str], series: dict[str, LiveSeries]) -> charts.ChartOptions:
    """The widgets above the charts; the choice is kept per run for this browser session. From
    8 ranks the default is the rank mean with its band; a log y axis is chosen per chart, and
    until a person chooses, every drawn metric whose values span more than two decades has one."""
    saved: dict[int, charts.ChartOptions] = st.session_state.setdefault("chart-options", {})
    o = saved.get(run_id, charts.ChartOptions(ranks=charts.default_rank_mode(nproc)))
    # One row: the two choices a person makes often as buttons, the rest in popovers (drawn
    # when opened), so that the first chart starts right under it. A row that wraps, each control
    # as wide as itself: fixed columns cut "relative time" and the popovers' labels at 800 px.
    row = st.container(horizontal=True, vertical_alignment="bottom", gap="medium")
    ranks = row.segmented_control("Ranks", charts.RANK_MODES, default=o.ranks, key=f"ranks-{run_id}",
                                   help=RANKS_HELP if nproc > 1 else None)
    x = row.segmented_control("X axis", charts.X_AXES, default=o.x, key=f"x-{run_id}")
    smoothing = row.popover("Smoothing", icon=":material/tune:").slider(
        "EMA weight", 0.0, 0.99, o.smoothing, 0.01, key=f"ema-{run_id}",
        help="Weight of the running average: the smoothed line is drawn over the faint values")
    loggable = [k for k in keys if metric_registry.spec_for(k).log_ok]  # never accuracy or other shares
    log_widget, chosen = f"log-{run_id}", f"log-chosen-{run_id}"
    if not st.session_state.get(chosen):  # not chosen yet: the wide-ranging metrics, as they become so
        st.session_state[log_widget] = sorted(log_defaults(series) & set(loggable))
    log_keys = row.popover("Log scale", icon=":material/show_chart:").pills(
        "Charts on a log scale", loggable, selection_mode="multi", format_func=metric_registry.label, key=log_widget,
        on_change=st.session_state.__setitem__, args=(chosen, True),
        help="The charts drawn on a logarithmic y axis (values of zero or less are left out); until you choose, "
             "those whose values span more than two decades")
    superseded = row.toggle("Superseded steps", value=o.show_superseded, key=f"superseded-{run_id}",
                             help="Show what abandoned attempts logged after the step the run was resumed from")
    # A segmented control can be clicked off; keep the last choice then.
    saved[run_id] = charts.ChartOptions(ranks=ranks or o.ranks, x=x or o.x, log_keys=frozenset(log_keys or ()),
                                        smoothing=smoothing, show_superseded=superseded)
    return saved[run_id]


def log_defaults(series: dict[str, LiveSeries]) -> frozenset[str]:
    return charts.auto_log_keys({k: s.rows for k, s in series.items()})


def waiting(d: dict[str, Any]) -> None:
    """What a run without metrics says instead of charts."""
    if d["status"] in TERMINAL_VALUES:
        st.info("This run reported no metrics.")
    else:  # what it does meanwhile: queued for what, launching, setting up, compiling, first step
        newest = d["attempts"][-1] if d["attempts"] else None
        st.info(style.plain(startup_text(d["status"], newest, d["config"]) or d["status_reason"] or "")
                or "Waiting for the first metrics from the ranks…", icon=":material/hourglass_top:")


def _toggled(run_id: int, section: str) -> None:
    panel_layout.set_open(section, bool(st.session_state.get(_section_key(run_id, section))))


def _show_all(run_id: int, section: str) -> None:
    st.session_state[f"shown-all-{run_id}"] = {*st.session_state.get(f"shown-all-{run_id}", ()), section}


def full_width_button(run_id: int, key: str, full: bool, where: str) -> None:
    """The control above a chart that opens it alone at its section's full width, or brings the
    section's charts back."""
    st.button("Back to all charts" if full else "Full width", key=f"full-{where}-{run_id}-{key}", type="tertiary",
              icon=":material/close_fullscreen:" if full else ":material/open_in_full:",
              on_click=panel_layout.set_full, args=(None if full else key,),
              help=("Show every chart of this section again" if full
                    else f"Open {metric_registry.label(key)} alone at the section's full width"))


@dataclass(frozen=True)
class Drawing:
    """How one place of the Run page (``where``: the Overview, the Metrics section) draws a run's
    charts: its options with the shared box zoom and marked step, and the run's lineage."""

    d: dict[str, Any]
    options: charts.ChartOptions
    cutoffs: dict[int, float]
    where: str

    def chart(self, key: str, series: LiveSeries) -> None:
        """One metric's chart, whose drawn box zooms, and whose clicked step marks, every chart here."""
        chart_widgets.zoomable_chart(self.d["id"], key,
                                     chart_widgets.run_chart(self.d, key, series, self.cutoffs, self.options),
                                     self.options.x, self.where)


def drawing(d: dict[str, Any], options: charts.ChartOptions, where: str) -> Drawing:
    """The notes of a box zoom and a marked step (each with its reset), then how the charts draw."""
    run_id = d["id"]
    options = replace(options, zoom=chart_widgets.zoom_of(run_id), cursor=chart_widgets.cursor_of(run_id))
    chart_widgets.zoom_note(run_id, options.x)
    chart_widgets.cursor_note(run_id, where)
    return Drawing(d, options, data.lineage_cutoffs(d["attempts"]), where)


def metric_charts(d: dict[str, Any], shown: Plan, series: dict[str, LiveSeries]) -> None:
    """The options, then each section: an expander with its chart count; open, its charts two a
    row (or the one open full width), and "Show all" under a section drawn in part."""
    if not shown.keys:
        waiting(d)
        return
    run_id = d["id"]
    here = drawing(d, replace(chart_options(run_id, d["nproc"], shown.keys, series),
                              isolated=chart_widgets.isolated_ranks(run_id, d["nproc"])), "metrics")
    for section in shown.sections:
        box = st.expander(style.plain(section.label), expanded=shown.open[section.id],
                          key=_section_key(run_id, section.id), on_change=_toggled, args=(run_id, section.id))
        keys = drawn(section, shown.open[section.id], shown.full, section.id in shown.shown_all)
        if not keys:
            continue
        with box:
            if shown.full in section.keys:
                full_width_button(run_id, keys[0], True, "metrics")
                here.chart(keys[0], series[keys[0]])
                continue
            cols = st.columns(2)
            for i, key in enumerate(keys):
                with cols[i % 2]:
                    full_width_button(run_id, key, False, "metrics")
                    here.chart(key, series[key])
            if len(keys) < len(section.keys):
                st.button(f"Show all {len(section.keys)} charts", key=f"show-all-{run_id}-{section.id}",
                          icon=":material/expand_more:", on_click=_show_all, args=(run_id, section.id))
    cursor = here.options.cursor
    if cursor is None:
        chart_widgets.latest_table(d["metrics"], shown.drawn)
    else:  # the shared cursor's read-out: every drawn metric at the marked step
        chart_widgets.latest_table({k: chart_widgets.values_at(s.rows, here.cutoffs, cursor)
                                    for k, s in series.items()}, shown.drawn,
                                   title=f"Value per rank at step {cursor:,}")
