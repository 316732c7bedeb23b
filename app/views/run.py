"""Run: one run, live. The header (always shown) holds the run's name and status badge, its actions
(Resume ▾, Fork…, Pause, Cancel…), what it is doing (start-up phase, retry, failure at the top of a
failed run), progress and the headline numbers. Below it one section at a time: Overview (event
badges, the main curves and the pinned ones, latest values, warnings), Metrics (the charts in
sections by prefix, app/panels/), Checkpoints (with pins and the Young–Daly advice), Logs (the log
first, its level filter, runyard's traceback frames folded), Attempts (timeline, table, warnings,
alerts), System, Config. The section is a query parameter (``/run?run=3&section=Metrics``), so a
link opens it.

Live without fade: Streamlit fades (opacity 0.33, ``data-stale``) what a fragment drew while the
fragment runs again and has not yet redrawn it, once that takes over half a second. So the
header is its own fragment, cheap (one cached read of the run, no query per element): it
redraws in a few milliseconds. It reads the run once per refresh and keeps that snapshot in the
session for the section below, so the badge, the actions and the numbers always agree (a
SUCCEEDED badge never sits beside Cancel). The section is a second fragment that draws only the
chosen section (a CSS rule keeps what a panel drew at full opacity while it redraws, for when a
redraw takes longer than that half second: many charts, a loaded machine); the charts keep each
metric's downsampled series in st.session_state and ask the metric store only for what is new
every 2 s (app.live_series.merge_series).

The first paint is kept cheap for the browser: Streamlit loads an element's code the first
time one is drawn, and the code viewer, the JSON viewer and the slider each cost the browser a
few tenths of a second (docs/benchmarks-journal.md, "Run page first render"). Only the chosen
section is drawn (st.tabs would draw every tab), the system charts wait for their toggle, and the
smoothing slider sits in a popover, which draws its contents when opened."""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import chart_widgets, data, run_panels, style
from app.alerts_panel import run_alerts
from app.live_series import LiveSeries
from app.panels import metrics as panel_metrics
from app.panels.overview import overview_charts, shown_keys
from app.panels.sections import chart_order
from app.run_actions import SECTION_KEY, actions, metadata_line, status_badge
from app.run_panels import attempts_table, checkpoint_advice, checkpoint_table, events_list, failure_summary, log_tails
from app.system import latest_window, summary_line, system_panels
from db.states import TERMINAL_VALUES, RunStatus
from orchestrator.format import clock, start_text, startup_text, step_text, where_text
from orchestrator.scripts.attempt_watch import script_facts

# Event kinds shown as badges at the top of the run: (colour, icon, label).
EVENT_BADGES = {
    "straggler": ("orange", ":material/slow_motion_video:", "straggler"),
    "desync": ("red", ":material/sync_problem:", "desync"),
    "nan": ("red", ":material/error:", "NaN"),
    "hang": ("red", ":material/hourglass_disabled:", "hang"),
}
# The sections, in order; the chosen one is the query parameter ``section`` (absent for Overview).
SECTIONS = ["Overview", "Metrics", "Logs", "Checkpoints", "Attempts", "System", "Config"]
# Seconds between refreshes: an active run moves every few seconds; a finished one only changes
# when someone resumes it (rebuilding the charts costs the server some CPU on every refresh).
ACTIVE_REFRESH_S, FINISHED_REFRESH_S = 2, 10
style.apply()
runs = data.list_runs()
if not runs:
    st.title("Run")
    st.info("No runs yet. Start one on the **New run** page.")

    @st.fragment(run_every=ACTIVE_REFRESH_S)
    def wait_for_a_run() -> None:
        """The page comes alive by itself once a run exists (submitted from elsewhere, or this
        page opened a moment before the submit: the list it read then was empty)."""
        if data.list_runs():
            st.rerun(scope="app")

    wait_for_a_run()
    st.stop()

ids = [r["id"] for r in runs]
requested = st.query_params.get("run")
default_id = int(requested) if requested and requested.isdigit() and int(requested) in ids else ids[0]
# The header first, then one row with the section control and the run picker: the picker is
# chosen first (the header draws the run it names) but drawn beside the sections, not in a row of
# its own above the header, which pushed the first chart below the first screen (issue 56).
header_slot = st.container()
toolbar = st.container(horizontal=True, vertical_alignment="center", horizontal_alignment="distribute")
sections_slot = toolbar.container(width="content")  # filled below, once the header is drawn
run_id = toolbar.selectbox(
    "Run", ids, index=ids.index(default_id), label_visibility="collapsed", width=320,
    # No status here: the picker is drawn once per full script run, so it would go stale while
    # the live panel below moves on (it showed STARTING beside a SUCCEEDED badge).
    format_func=lambda i: next(f"#{r['id']} {r['name']}" for r in runs if r["id"] == i),
)
st.query_params["run"] = str(run_id)
SNAPSHOT_KEY = f"run-snapshot/{run_id}"


def header(d: dict[str, Any]) -> None:
    """Name and badge with the actions beside them (one row), what the run is doing now, progress
    and one row of headline numbers with the costs: compact, so that the first chart shows whole
    in the first screen (issue 56). The actions are sent before the badge: while the browser
    applies a refresh, a new badge never shows beside the old actions (SUCCEEDED beside Cancel),
    at most the old badge beside the new ones."""
    title, buttons = st.columns([2, 3], vertical_alignment="center")
    with buttons:
        actions(d)
    star = " ★" if d["starred"] else ""
    title.markdown(f"## #{d['id']} {style.plain(d['name'])}{star} &nbsp; {status_badge(d)}"
                   + (" :gray-badge[archived]" if d["archived"] else ""))
    # What comes and goes with the run's state (reasons, a retry's warning, a failure's summary)
    # sits in two containers that are always drawn: Streamlit matches a redrawn element to the
    # one before by its place in the page, so an element that appeared above the progress bar
    # or the headline numbers moved them down a place, and until the redraw ended the old ones
    # stayed where they were: two copies of the headline numbers during a retry (issue 29).
    with st.container():
        metadata_line(d)
        if waits := "; ".join(filter(None, [start_text(d.get("start_estimate")), d["status_reason"]])):
            st.caption(style.plain(waits))  # a queued run: when it should start, then why it waits
        if starting := startup_text(d["status"], d["attempts"][-1] if d["attempts"] else None, d["config"]):
            st.caption(style.plain(starting))
        if where := where_text(d["config"], d["attempts"][-1] if d["attempts"] else None):
            st.caption(style.plain(where))
    st.progress(d["progress"], text=f"step {step_text(d['step'], d['max_steps'], ' / ')}")
    with st.container():
        facts = script_facts(d["config"], d["attempts"], d["checkpoints"])
        if facts:
            # Paths and the watchdog's sentence escaped: a path may hold characters Markdown would read.
            st.caption(" · ".join(f"**{label.capitalize()}**: {style.plain(text)}" for label, text in facts))
        if d["status"] == RunStatus.RETRYING and d["retry_at"]:
            st.warning(f"Retrying: next attempt at {clock(d['retry_at'])} (retries used: {d['retries_used']}).",
                       icon=":material/refresh:")
        if d["parent_run_id"]:
            st.caption(f"Forked from run #{d['parent_run_id']} at step {d['parent_step']}.")
        failure_summary(d)
    run_panels.headline(d)  # the tiles, Your cost and the Cloud reference among them, never mixed


def event_badges(d: dict[str, Any], series: dict[str, LiveSeries]) -> None:
    """A row of badges: what the checks found, with counts (stragglers, desyncs, NaNs, hangs);
    a green one for the checks that ran and found nothing; a grey one for each check that did
    not run, saying why (:func:`health_checks`). Without a "nan" event from the trainer, NaNs
    are counted in the metric store, every metric of the run (drawn or not) along its lineage."""
    counts = dict(data.event_counts(d["id"]))
    if not counts.get("nan"):
        counts["nan"] = data.nan_count(d["id"], data.lineage_cutoffs(d["attempts"]))
    shown = [f":{color}-badge[{icon} {label} × {counts[kind]}]"
             for kind, (color, icon, label) in EVENT_BADGES.items() if counts.get(kind)]
    unchecked = health_checks(d, has_metrics=bool(d["metrics"]) or any(s.rows for s in series.values()))
    found = {"stragglers": "straggler", "desyncs": "desync", "nans": "nan", "hangs": "hang"}
    clean = [CHECK_LABELS[c] for c in CHECK_LABELS if c not in unchecked and not counts.get(found[c])]
    if clean:
        shown.append(f":green-badge[:material/check: no {_and(clean)}]")
    by_reason: dict[str, list[str]] = {}
    for check, why in unchecked.items():
        by_reason.setdefault(why, []).append(CHECK_LABELS[check])
    shown += [f":gray-badge[:material/help: {_and(labels)} not checked ({why})]" for why, labels in by_reason.items()]
    st.markdown(" ".join(shown))


CHECK_LABELS = {"stragglers": "stragglers", "desyncs": "desyncs", "nans": "NaNs", "hangs": "hangs"}


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def health_checks(d: dict[str, Any], has_metrics: bool) -> dict[str, str]:
    """{check: why it has not run} for the run's newest attempt; a check missing from the
    result ran (and its findings, if any, are the event counts).

    - hangs: the scheduler's watchdog judges every live attempt from its launch on, except a
      plain script before its first line of output (nothing to measure progress by);
    - NaNs: judged on the stored metrics, so from the first one;
    - stragglers and desyncs: rank 0's ``checks`` event says whether they run (db/vocabulary/checks.py);
      a script that never reported through runyard's SDK has none.
    """
    if not d["attempts"]:
        return dict.fromkeys(CHECK_LABELS, "the run has not started")
    newest = d["attempts"][-1]
    script = d["config"]["workload"]["kind"] == "script"
    out: dict[str, str] = {}
    if script and newest["first_step_at"] is None and newest.get("progress_at") is None:
        out["hangs"] = "the script has printed nothing yet"
    if not has_metrics:
        out["nans"] = "no metric recorded yet"
    checks = d.get("rank_checks")
    if checks is None:
        why = ("the script has not reported through runyard's SDK" if script
               else "no metrics logged" if d["status"] in TERMINAL_VALUES else "no metrics logged yet")
        out.update(stragglers=why, desyncs=why)
    else:
        out.update({check: why for check, why in checks.items() if why is not None})
    return out


def latest_values(d: dict[str, Any]) -> None:
    """The newest value of each metric on each rank, one row per metric, labelled and formatted by
    the metric registry (every key, in chart order)."""
    chart_widgets.latest_table(d["metrics"], chart_order(d["metrics"]))


def overview(d: dict[str, Any]) -> None:
    """The run at a glance: checks found, the main curves (only theirs fetched), newest values,
    the system's newest window, warnings."""
    keys = panel_metrics.run_keys(d["id"])
    series = panel_metrics.live_series(d, shown_keys(keys))
    event_badges(d, series)
    overview_charts(d, keys, series)
    latest_values(d)
    st.caption(summary_line(latest_window(d["id"])))
    events_list(d)
    run_alerts(d["id"])  # alerts (app/alerts_panel.py)


def metrics(d: dict[str, Any]) -> None:
    """The charts in their sections (app/panels/metrics.py), under the event badges (a NaN badge
    beside the curve it marks); only the drawn charts' series are fetched."""
    shown = panel_metrics.plan(d["id"])
    series = panel_metrics.live_series(d, shown.drawn)
    event_badges(d, series)
    panel_metrics.metric_charts(d, shown, series)


def checkpoints(d: dict[str, Any]) -> None:
    checkpoint_table(d)
    if d["attempts"]:  # advice about save intervals means nothing before the run has run
        checkpoint_advice(d["id"])


def attempts(d: dict[str, Any]) -> None:
    attempts_table(d)
    events_list(d)
    run_alerts(d["id"])


def system(d: dict[str, Any]) -> None:
    """The newest system window in one line; its charts (up to 11 with GPUs, each costing the
    browser 0.1-0.3 s to draw) only while the toggle is on."""
    st.caption(summary_line(latest_window(d["id"])))
    if st.toggle("Show system charts (GPUs, processes, host)", key=f"system-{d['id']}"):
        system_panels(d["id"])


def config(d: dict[str, Any]) -> None:
    st.json(d["config"])


DRAW = {"Overview": overview, "Metrics": metrics, "Logs": log_tails, "Checkpoints": checkpoints, "Attempts": attempts,
        "System": system, "Config": config}
_listed = next(r for r in runs if r["id"] == run_id)
every = FINISHED_REFRESH_S if _listed["status"] in TERMINAL_VALUES else ACTIVE_REFRESH_S


@st.fragment(run_every=every)
def live_header() -> None:
    """The header, from one read of the run; the snapshot is kept for the section below."""
    d = data.run_detail(run_id)
    st.session_state[SNAPSHOT_KEY] = d
    if d is None:
        st.error(f"Run {run_id} does not exist.")
        return
    header(d)


def snapshot() -> dict[str, Any] | None:
    """The run as the header last read it (read again only when the header has not yet)."""
    if SNAPSHOT_KEY not in st.session_state:
        st.session_state[SNAPSHOT_KEY] = data.run_detail(run_id)
    detail: dict[str, Any] | None = st.session_state[SNAPSHOT_KEY]
    return detail


with header_slot:
    live_header()
with sections_slot:  # the sections on the left, the picker on the right
    section = st.segmented_control("Section", SECTIONS, default="Overview", key=SECTION_KEY, bind="query-params",
                                   label_visibility="collapsed") or "Overview"


@st.fragment(run_every=None if section == "Config" else every)
def live_section() -> None:
    d = snapshot()
    if d is not None:
        DRAW[section](d)


live_section()
