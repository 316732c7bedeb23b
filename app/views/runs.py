"""Runs: every run with its status, progress, elapsed time, ETA, cost so far and projected, best loss
and headline metric, live: a workspace to search (name, tag, note, config value), filter (status,
tags, starred, archived), sort by any column, and act on the selected rows (open, compare, star,
archive, delete). A sweep's trial says which (the "sweep" column), and one stopped early says at
which step and by which sweep where a paused run says PAUSED; ``/runs?sweep=N`` opens the list
filtered to sweep N's trials (their tag, ``sweep:N``). Its energy and your cost stand beside the
cloud reference's cost ("Cloud ref."), never added to it (docs/COSTS.md).

The list is read by db.compare.runs_list (filtered and sorted in the database read, the summary
metrics in three statements for all the runs); the columns shown are chosen in "Columns" and kept
for this browser session."""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import streamlit as st

from app import data, run_actions, style
from app.alerts_panel import alert_mark, open_alerts
from app.charts.runs_grid import fitted, headline_text, loss_text, progress_percent, tags_text
from app.style import status_css
from db.compare import MAX_RUNS as MAX_COMPARED  # not app.compare_charts: the Runs page loads no Altair
from db.estimates import published_machine, queue_starts
from db.states import TERMINAL, RunStatus
from orchestrator.cost_text import energy_short
from orchestrator.format import (
    duration,
    eta_text,
    note_line,
    queue_text,
    start_text,
    status_words,
    step_text,
    usd,
    where_short,
)
from orchestrator.sweeps.space import sweep_tag

style.apply()

OPEN_RUN = "runs_open_run"
SWEPT = "runs_sweep_applied"  # the ?sweep= the tag filter was last set from
COMPARE_RUNS = "runs_compare_ids"  # not a widget key: the Compare button is "runs_compare"
# What "Sort by" offers: a label -> (db.run_list.LIST_SORTS key, largest first by default).
SORTS = {
    "newest": ("id", True), "name": ("name", False), "status": ("status", False), "progress": ("progress", True),
    "elapsed (wall time)": ("elapsed", True), "cost": ("cost", True), "projected cost": ("projected", True),
    "best loss": ("best_loss", False), "headline metric": ("headline", True), "attempts": ("attempts", True),
    "starred first": ("starred", True),
}
# Every column the table can show, in order; the ones shown until a person chooses in "Columns".
COLUMNS = ["run", "★", "name", "sweep", "status", "waiting for", "alert", "progress", "step", "elapsed", "ends at",
           "energy", "your cost", "cost", "projected", "best loss", "headline", "attempts", "where", "tags", "note",
           "id"]
DEFAULT_COLUMNS = ["run", "★", "name", "status", "waiting for", "alert", "progress", "step", "elapsed", "ends at",
                   "energy", "your cost", "cost", "best loss", "headline", "tags"]
TITLES = {"cost": "Cloud ref."}  # a column's header where it is not the column's name
WAITING = {RunStatus.QUEUED.value, RunStatus.RETRYING.value}
TERMINAL_VALUES = {s.value for s in TERMINAL}


def trial_text(trial: dict[str, Any] | None) -> str:
    """Which sweep's trial a run is: ``lr-search #3, trial 4``; empty for a run of no sweep."""
    return f"{trial['sweep_name']} #{trial['sweep_id']}, trial {trial['number']}" if trial else ""


@st.cache_data(ttl=1.0, show_spinner=False)
def queue_line() -> str | None:
    """The line above the list on the whole queue: how many runs wait and when all should be done
    (db/estimates.py queue_starts); None when nothing is queued. (Here, not in app/data.py, which
    is at its 400 lines.)"""
    with data.sessions()() as s:
        return queue_text(queue_starts(s, time.time(), published_machine(data.settings())))


def waiting_text(r: dict[str, Any]) -> str:
    """Why a queued or retrying run waits; for a queued one, when it should start first
    (``starts ≈ 15:40, after run 38; queued: waiting for 2 free GPU(s) …``)."""
    if r["status"] not in WAITING:
        return ""
    start = start_text(r.get("start_estimate"), short=True)
    return "; ".join(part for part in (start, r["status_reason"] or "") if part)


def runs_frame(runs: list[dict[str, Any]], marks: dict[int, Any]) -> pd.DataFrame:
    """The table's every column (the chooser picks which are shown)."""
    return pd.DataFrame({
        "run": [f"run?run={r['id']}" for r in runs],
        "id": [r["id"] for r in runs],
        "★": ["★" if r["starred"] else "" for r in runs],
        "name": [r["name"] + (" (archived)" if r["archived"] else "") for r in runs],
        "sweep": [trial_text(r["trial"]) for r in runs],
        "status": [status_words(r["status"], r["step"], r["trial"]) for r in runs],
        "waiting for": [waiting_text(r) for r in runs],
        "alert": [alert_mark(r["id"], marks) for r in runs],
        "progress": [progress_percent(r["progress"]) for r in runs],
        "step": [step_text(r["step"], r["max_steps"]) for r in runs],
        "elapsed": [duration(r["elapsed_s"]) for r in runs],
        "ends at": [eta_text(r["status"], r["eta_s"], r["eta_range_s"], short=True) for r in runs],
        "energy": [energy_short(r.get("energy")) for r in runs],
        "your cost": [usd(r["cost"]["yours"]["usd"]) for r in runs],
        "cost": [usd(r["cost_usd"]) for r in runs],
        "projected": [usd(r["cost_projected_usd"]) for r in runs],
        "best loss": [loss_text(r["best_loss"]) for r in runs],
        "headline": [headline_text(r) for r in runs],
        "attempts": [r["attempt_count"] for r in runs],
        "where": [where_short(r["executor"], r["job_id"], r["job_state"]) for r in runs],
        "tags": [tags_text(r["tags"]) for r in runs],
        "note": [note_line(r["note"]) for r in runs],
    })


if (chosen := st.session_state.pop(OPEN_RUN, None)) is not None:
    run_actions.open_run(chosen)
if (compared := st.session_state.pop(COMPARE_RUNS, None)) is not None:
    st.switch_page("views/compare.py", query_params={"runs": ",".join(map(str, compared))})

st.title("Runs")
if (swept := st.query_params.get("sweep", "")) != st.session_state.get(SWEPT) and swept.isdigit():
    # Opened for a sweep's trials (/runs?sweep=N): the tag each trial carries, once per address.
    st.session_state[SWEPT] = swept
    if sweep_tag(int(swept)) in data.run_tags():
        st.session_state["runs_tags"] = [sweep_tag(int(swept))]
c1, c2, c3 = st.columns([3, 2, 2])
search = c1.text_input("Search", placeholder="name, tag, note or config value (lr=0.001)", key="runs_search",
                       help="Every word must match a part of the run's name, one of its tags, its note or a config "
                            "value; key=value matches one config value (train.lr=0.001, or lr=1e-3)")
statuses = c2.multiselect("Status", [s.value for s in RunStatus], placeholder="all statuses", key="runs_status")
tags = c3.multiselect("Tags", data.run_tags(), placeholder="any tag", key="runs_tags")
with st.container(horizontal=True, vertical_alignment="bottom"):
    sort_label = st.selectbox("Sort by", list(SORTS), key="runs_sort", width=200) or "newest"
    column, largest_first = SORTS[sort_label]
    descending = largest_first != st.toggle("Reverse", key="runs_reverse", help="The other way round")
    starred = st.toggle("Starred only", key="runs_starred")
    archived = st.toggle("Show archived", key="runs_archived", help="Archived runs are hidden until shown here")
    shown = st.popover("Columns", icon=":material/view_column:").multiselect(
        "Columns shown", COLUMNS, default=DEFAULT_COLUMNS, key="runs_columns")


@st.fragment(run_every=2)
def runs_table() -> None:
    runs = data.runs_list(tuple(statuses), search.strip(), tuple(tags), starred, archived, column, descending)
    if not runs:
        if search or statuses or tags or starred:
            st.info("No run matches. Clear the search or the filters above to see every run"
                    + ("." if archived else ", or show the archived ones."))
            return
        st.info("No runs yet. Start one on the **New run** page, or `runyard submit examples/digits.toml`.")
        st.page_link("views/new_run.py", label="New run", icon=":material/add_circle:")
        return
    if (queue := queue_line()) is not None:
        st.caption(queue)
    # The actions above the grid: reachable without scrolling past the runs (filled once the
    # grid has said which rows are selected).
    actions = st.container()
    frame, widths = fitted(runs_frame(runs, open_alerts()), TITLES)
    event = st.dataframe(
        frame.style.apply(lambda _: [status_css(r["status"]) for r in runs], subset=["status"]),
        hide_index=True,
        column_order=[c for c in COLUMNS if c in (shown or DEFAULT_COLUMNS)],
        column_config={c: st.column_config.Column(width=w) for c, w in widths.items()} | {
            "run": st.column_config.LinkColumn("run", display_text=r"run\?run=(\d+)", width=widths["run"]),
            "★": st.column_config.TextColumn("★", help="Starred (select the row, then Star)", width=widths["★"]),
            # Whole percent, rounded down: two decimals made the bar's text wider than its column.
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=100.0, format="%d%%",
                                                        width=widths["progress"]),
            "waiting for": st.column_config.TextColumn(
                "waiting for", width=widths["waiting for"],
                help="Why a queued or retrying run waits, and when a queued one should start (a long reason "
                     "ends in …: the run's page says it whole)"),
            "energy": st.column_config.TextColumn("energy", width=widths["energy"],
                                                  help="Measured (≈: estimated from power x time); "
                                                  "– not measured (docs/COSTS.md)"),
            "your cost": st.column_config.TextColumn(
                "your cost", width=widths["your cost"],
                help="Energy x your tariff x PUE + your hardware's amortisation, so far (Settings); "
                     "– until you set your electricity tariff in Settings"),
            "cost": st.column_config.TextColumn(TITLES["cost"], width=widths["cost"],
                                                help="Cloud reference: device time at the list price "
                                                "the run was submitted at, so far, every attempt included"),
            "projected": st.column_config.TextColumn(
                "projected", width=widths["projected"], help="Cloud reference so far + ETA x the run's list price"),
            "best loss": st.column_config.TextColumn(
                "best loss", width=widths["best loss"],
                help="The lowest loss along the run's lineage, a fork's parent's steps included (the mean over "
                     "ranks); – before any"),
            "headline": st.column_config.TextColumn(
                "headline", width=widths["headline"],
                help="The final value of the workload's headline metric (eval accuracy, eval loss…)"),
            "alert": st.column_config.TextColumn("alert", width=widths["alert"],
                                                 help="An open alert (docs/ALERTS.md): its triggers"),
        },
        on_select="rerun",
        selection_mode="multi-row",
        key="runs_table",
    )
    st.caption(f"{len(runs)} run(s)" + (f", the newest {len(runs)} that match, " if len(runs) >= 200 else " ")
               + f"sorted by {sort_label}" + ("" if descending == largest_first else ", reversed") + ".")
    selected = [runs[i] for i in event.selection.rows if i < len(runs)]
    with actions:
        selection_actions(sorted(selected, key=lambda r: r["id"]))


def selection_actions(selected: list[dict[str, Any]]) -> None:
    """Open one selected run, compare the selected ones (up to the Compare page's limit), star,
    archive or delete them.

    st.switch_page does not leave a fragment: the choice is kept in the session and the whole
    page reruns and switches (opened in this browser session, the page draws without a new
    tab's start-up)."""
    ids = [r["id"] for r in selected]
    viewing = data.read_only_reason()
    with st.container(horizontal=True, vertical_alignment="center"):
        if st.button(f"Open run #{ids[0]}" if len(ids) == 1 else "Open run", disabled=len(ids) != 1,
                     key="runs_open", icon=":material/open_in_browser:"):
            st.session_state[OPEN_RUN] = ids[0]
            st.rerun(scope="app")
        too_many = len(ids) > MAX_COMPARED
        if st.button(f"Compare {len(ids)} runs" if len(ids) > 1 else "Compare", type="primary",
                     disabled=len(ids) < 2 or too_many, key="runs_compare", icon=":material/stacked_line_chart:"):
            st.session_state[COMPARE_RUNS] = ids
            st.rerun(scope="app")
        all_starred = bool(selected) and all(r["starred"] for r in selected)
        if st.button("Unstar" if all_starred else "Star", disabled=not ids or viewing is not None, key="runs_star",
                     icon=":material/star:", help=viewing):
            st.toast(style.plain(data.mark_runs(ids, starred=not all_starred)))
            st.rerun(scope="fragment")
        all_archived = bool(selected) and all(r["archived"] for r in selected)
        if st.button("Unarchive" if all_archived else "Archive", disabled=not ids or viewing is not None,
                     key="runs_archive", icon=":material/archive:",
                     help=viewing or "Hide finished runs from this list (Show archived brings them back)"):
            st.toast(style.plain(data.mark_runs(ids, archived=not all_archived)))
            st.rerun(scope="fragment")
        if len(selected) == 1 and viewing is None:
            delete_menu(selected[0])
        else:
            st.button("Delete…", disabled=True, key="runs_delete_off", icon=":material/delete:",
                      help=viewing or "Select one run to delete it")
    st.caption(f"Compare takes at most {MAX_COMPARED} runs: unselect {len(ids) - MAX_COMPARED}." if too_many
               else "Select rows (the boxes on the left) to open, compare, star, archive or delete runs; the link "
                    "in the *run* column opens a run in a new tab.")


def delete_menu(run: dict[str, Any]) -> None:
    """Delete…: what would go (pinned checkpoints named), then the button that deletes; for a run
    that cannot be deleted, the sentence saying why (cancel it first)."""
    with st.popover("Delete…", icon=":material/delete:", key=f"runs-delete-menu-{run['id']}"):
        plan = data.deletion_plan(run["id"])
        if plan.refused:
            st.warning(style.plain(plan.refused), icon=":material/block:")
            return
        st.markdown(style.plain(plan.confirmation()))
        if st.button(f"Delete run #{run['id']}", type="primary", icon=":material/delete_forever:",
                     key=f"runs-delete-{run['id']}"):
            st.toast(style.plain(data.delete_run(run["id"])))
            st.rerun(scope="app")


runs_table()
