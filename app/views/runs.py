"""Runs: every run with its status, progress, elapsed time, ETA, cost so far and projected, best loss
and headline metric, live: a workspace to search (name, tag, note, config value), filter (status,
tags, starred, archived, and the runs' numbers: ``best loss < 0.01``), sort by any column, group by
a config value or tag (a table per group, with its count and best loss), select (all the shown rows
at once, or clear), act on the selected rows (open, compare, star, archive, delete), and draw the
selected runs' parallel coordinates (the config keys that differ against their best loss; the
sweep page's component, app/charts/parallel.py). A sweep's trial says which (the "sweep" column),
and one stopped early says at which step and by which sweep where a paused run says PAUSED;
``/runs?sweep=N`` opens the list filtered to sweep N's trials (their tag, ``sweep:N``). Its energy
and your cost stand beside the cloud reference's cost ("Cloud ref."), never added to it
(docs/COSTS.md).

The list is read by db.compare.runs_list (filtered and sorted in the database read, the summary
metrics in three statements for all the runs), then filtered on its numbers and grouped here
(app/charts/runs_analysis.py); the configs come in one statement (db.run_list.run_configs) when
grouping or drawing needs them; the columns shown are chosen in "Columns" and kept for this
browser session. A selection is a set of runs, not of the grid's row positions, which move (a new
run, a filter, a sort): the selected runs' ids are kept in the session (:func:`picked`, :func:`grid`)."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pandas as pd
import streamlit as st

from app import data, run_actions, style
from app.alerts_panel import alert_mark, open_alerts
from app.charts import parallel
from app.charts.runs_analysis import (
    BY_TAG,
    EXAMPLE,
    NO_GROUPING,
    NOT_SET,
    FilterError,
    Group,
    fields_text,
    filtered,
    group_keys,
    grouped,
    parse_filter,
    unread_note,
)
from app.charts.runs_grid import (
    HELPS,
    fit_columns,
    fitted,
    headline_text,
    loss_text,
    progress_percent,
    tags_text,
    trial_text,
    waiting_text,
)
from app.panels.coordinates import parallel_component
from app.style import status_css
from db.compare import MAX_RUNS as MAX_COMPARED  # not app.compare_charts: the Runs page loads no Altair
from db.compare import config_diff
from db.estimates import published_machine, queue_starts
from db.run_list import run_configs
from db.states import RunStatus
from orchestrator.cost_text import energy_short
from orchestrator.format import (
    duration,
    eta_text,
    note_line,
    queue_text,
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
SELECTED = "runs_selected"  # the selected runs' ids, whichever rows they are in
READ = 200  # the most runs the list reads (db.compare.runs_list's limit): the newest that match
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
TABLE = "runs_table"  # the grid's key; a group's grid adds the grouping and the group's label
MAX_AXES = 10  # the most config keys the parallel coordinates draw (those that differ, in order)
NOT_DRAWN = {"tags"}  # config keys the parallel coordinates leave out (the name is never diffed)


@st.cache_data(ttl=1.0, show_spinner=False)
def queue_line() -> str | None:
    """The line above the list on the whole queue: how many runs wait and when all should be done
    (db/estimates.py queue_starts); None when nothing is queued. (Here, not in app/data.py, which
    is at its 400 lines.)"""
    with data.sessions()() as s:
        return queue_text(queue_starts(s, time.time(), published_machine(data.settings())))


@st.cache_data(ttl=2.0, show_spinner=False)
def configs_of(run_ids: tuple[int, ...] | None) -> dict[int, dict[str, Any]]:
    """The runs' flattened configs (None: the newest 200 runs'), in one statement."""
    with data.sessions()() as s:
        return run_configs(s, None if run_ids is None else list(run_ids))


@st.cache_resource
def read_filter(text: str) -> tuple[list[Any], str | None]:
    """The filter's clauses, or none and what is wrong with it."""
    try:
        return parse_filter(text), None
    except FilterError as exc:
        return [], str(exc)


def group_heading(by: str, group: Group) -> str:
    """A group's line above its table: ``**train.lr = 0.001** · 3 runs · best loss 0.0123``."""
    name = (f"tag {group.label}" if group.label != NOT_SET else "no tag") if by == BY_TAG else (
        f"{by} {group.label}" if group.label == NOT_SET else f"{by} = {group.label}")
    count = f"{len(group.runs)} run" + ("" if len(group.runs) == 1 else "s")
    return f"**{style.plain(name)}** · {count} · best loss {loss_text(group.best_loss)}"


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
c1, c2, c3, c4 = st.columns([3, 3, 2, 2])
search = c1.text_input("Search", placeholder="name, tag, note or config value (lr=0.001)", key="runs_search",
                       help="Every word must match a part of the run's name, one of its tags, its note or a config "
                            "value; key=value matches one config value (train.lr=0.001, or lr=1e-3)")
metric_filter = c2.text_input(
    "Filter", placeholder=f"{EXAMPLE}, steps >= 1000", key="runs_filter",
    help=f"Compare the runs' numbers: a field, then <, >, <=, >= or =, then a number; clauses joined by a comma "
         f"or 'and' must all hold, and a run without the value (no loss yet) matches none. The fields: "
         f"{fields_text()} ($2.5, 50%, 2h allowed)")
statuses = c3.multiselect("Status", [s.value for s in RunStatus], placeholder="all statuses", key="runs_status")
tags = c4.multiselect("Tags", data.run_tags(), placeholder="any tag", key="runs_tags")
with st.container(horizontal=True, vertical_alignment="bottom"):
    sort_label = st.selectbox("Sort by", list(SORTS), key="runs_sort", width=200) or "newest"
    column, largest_first = SORTS[sort_label]
    group_by = st.selectbox(
        "Group by", [NO_GROUPING, BY_TAG, *group_keys(list(configs_of(None).values()))], key="runs_group",
        width=220, help="A table per value of a config key (the keys that differ among the runs first) or per "
                        "tag, each with its count and best loss") or NO_GROUPING
    descending = largest_first != st.toggle("Reverse", key="runs_reverse", help="The other way round")
    starred = st.toggle("Starred only", key="runs_starred")
    archived = st.toggle("Show archived", key="runs_archived", help="Archived runs are hidden until shown here")
    shown_columns = st.popover("Columns", icon=":material/view_column:").multiselect(
        "Columns shown", COLUMNS, default=DEFAULT_COLUMNS, key="runs_columns")


@st.fragment(run_every=2)
def runs_table() -> None:
    runs = data.runs_list(tuple(statuses), search.strip(), tuple(tags), starred, archived, column, descending)
    clauses, problem = read_filter(metric_filter)
    if problem is not None:
        st.warning(f"The filter is not applied: {style.plain(problem)}", icon=":material/filter_alt_off:")
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
    shown = filtered(runs, clauses)
    said = "; ".join(map(str, clauses))
    if not shown:
        st.info(f"No run of the {len(runs)} listed has {style.plain(said)}: clear the filter to see them.")
        return
    # The actions above the grid: reachable without scrolling past the runs (filled once the
    # grids have said which rows are selected).
    actions = st.container()
    order = [c for c in COLUMNS if c in (shown_columns or DEFAULT_COLUMNS)]
    frame = runs_frame(shown, open_alerts())
    left_out: list[str] = []
    if set(order) == set(DEFAULT_COLUMNS):  # the defaults fit the grid: what must give way does
        frame, widths, order, left_out = fit_columns(frame, TITLES, order)
    else:  # the columns a person chose: all of them (the grid scrolls when they are wider)
        frame, widths = fitted(frame, TITLES, order)
    row_of = {r["id"]: i for i, r in enumerate(shown)}
    groups = grouped(shown, configs_of(tuple(row_of)) if group_by != NO_GROUPING else {}, group_by)
    for group in groups:
        key = TABLE if group_by == NO_GROUPING else f"{TABLE}-{group_by}-{group.label}"
        if group_by != NO_GROUPING:
            st.markdown(group_heading(group_by, group))
        rows = [row_of[r["id"]] for r in group.runs]
        grid(frame.iloc[rows], [shown[i] for i in rows], widths, order, key)
    st.caption(f"{len(runs)} run(s)" + (f", the newest {len(runs)} that match, " if len(runs) >= READ else " ")
               + f"sorted by {sort_label}" + ("" if descending == largest_first else ", reversed")
               + (f"; {len(shown)} of them with {style.plain(said)}" if clauses else "")
               + (f"; in {len(groups)} group(s) by {style.plain(group_by)}" if group_by != NO_GROUPING else "") + "."
               + (unread_note(len(runs), READ) if clauses or group_by != NO_GROUPING else "")
               + (f" Left out to fit the page: {', '.join(TITLES.get(c, c) for c in left_out)} (**Columns** shows "
                  "them)." if left_out else ""))
    chosen = sorted((r for r in shown if r["id"] in selected_ids()), key=lambda r: r["id"])
    with actions:
        selection_actions(chosen, [r["id"] for r in shown], len(selected_ids()) - len(chosen))
    if len(chosen) >= 2:
        parallel_section(chosen)


def selected_ids() -> set[int]:
    return set(st.session_state.get(SELECTED, ()))


def picked(key: str, ids: list[int]) -> None:
    """A person (un)checked rows of the grid ``key``, which showed the runs ``ids``: the selection gains
    their checked runs and loses their unchecked ones (in every grid: a run has a table per tag)."""
    rows = st.session_state[key]["selection"]["rows"]
    st.session_state[SELECTED] = sorted((selected_ids() - set(ids)) | {ids[i] for i in rows if 0 <= i < len(ids)})


def grid(frame: pd.DataFrame, runs: list[dict[str, Any]], widths: dict[str, int], order: list[str],
         key: str) -> None:
    """One table of runs (``frame``'s rows, the runs they show), its rows checked where their run
    is selected, wherever those rows are now."""
    ids, selected = [r["id"] for r in runs], selected_ids()
    rows = [i for i, run_id in enumerate(ids) if run_id in selected]
    held = st.session_state.get(key)
    if (rows or held is not None) and (held is None or list(held["selection"]["rows"]) != rows):
        st.session_state[key] = {"selection": {"rows": rows, "columns": [], "cells": []}}  # the grid checks them
    st.dataframe(
        frame.reset_index(drop=True).style.apply(lambda _: [status_css(r["status"]) for r in runs],
                                                 subset=["status"]),
        hide_index=True,
        column_order=order,
        column_config={c: st.column_config.Column(TITLES.get(c, c), width=w, help=HELPS.get(c))
                       for c, w in widths.items()} | {
            "run": st.column_config.LinkColumn("run", display_text=r"run\?run=(\d+)", width=widths["run"]),
            # Two decimals, rounded down: the column is as wide as a bar and "100.00%".
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=100.0,
                                                        format="%.2f%%", width=widths["progress"]),
        },
        on_select=partial(picked, key, ids),
        selection_mode="multi-row",
        key=key,
    )


def select_runs(ids: list[int]) -> None:
    """Select these runs, and only them (none: clear)."""
    st.session_state[SELECTED] = sorted(set(ids))


def parallel_section(chosen: list[dict[str, Any]]) -> None:
    """The selected runs' parallel coordinates: the config keys that differ among them against
    their best loss, a line per run."""
    configs = configs_of(tuple(r["id"] for r in chosen))
    diff = [(k, v) for k, v in config_diff([configs.get(r["id"], {}) for r in chosen]) if k not in NOT_DRAWN]
    drawn = parallel.drawn_keys(diff, MAX_AXES)
    st.markdown(f"**Parallel coordinates** of the {len(chosen)} selected runs")
    if not drawn:
        st.info("The selected runs' configs do not differ in a value two of them have (their names and tags "
                "aside): there is no setting to draw their best loss against.")
        return
    result = parallel_component()(data=parallel.runs_parallel_data(chosen, drawn), key="runs-parallel",
                                  default={"selection": None}, on_selection_change=lambda: None, height=390)
    brushed = parallel.selected_numbers(result.get("selection"), [r["id"] for r in chosen])
    st.caption(f"An axis per config key whose value differs among them ({len(drawn)} of the {len(diff)} keys that "
               "differ: those most of them have, at two values or more), then the best loss; a line per run, "
               "bright for a lower loss, grey without one. Drag along an axis to brush a range."
               + ("" if brushed is None else " In the brush: "
                  + (", ".join(f"#{r['id']} {style.plain(r['name'])}" for r in chosen if r["id"] in brushed)
                     or "none") + "."))


def selection_actions(selected: list[dict[str, Any]], shown_ids: list[int], hidden: int) -> None:
    """Select all the shown runs or none; open one selected run, compare the selected ones (up to the
    Compare page's limit), star, archive or delete them: those shown (``hidden`` more stay selected).

    st.switch_page does not leave a fragment: the choice is kept in the session and the whole
    page reruns and switches (opened in this browser session, the page draws without a new
    tab's start-up)."""
    ids = [r["id"] for r in selected]
    viewing = data.read_only_reason()
    shown = len(set(shown_ids))  # grouped by tag, a run with two tags is in two tables: one run
    with st.container(horizontal=True, vertical_alignment="center"):
        st.button("Select all", key="runs_select_all", icon=":material/select_all:", on_click=select_runs,
                  args=(shown_ids,), help=f"Select every run shown ({shown})")
        st.button("Clear", key="runs_select_none", icon=":material/deselect:", on_click=select_runs,
                  args=([],), disabled=not ids and not hidden, help="Select none")
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
            if not all_archived and not archived:  # gone from the list: no longer selected
                select_runs(sorted(selected_ids() - set(ids)))
            st.rerun(scope="fragment")
        if len(selected) == 1 and viewing is None:
            delete_menu(selected[0])
        else:
            st.button("Delete…", disabled=True, key="runs_delete_off", icon=":material/delete:",
                      help=viewing or "Select one run to delete it")
    st.caption(f"Compare takes at most {MAX_COMPARED} runs: unselect {len(ids) - MAX_COMPARED}." if too_many
               else "Select rows (the boxes on the left) to open, compare, star, archive or delete runs, and two or "
                    "more to draw their parallel coordinates below; the link in the *run* column opens a run in a "
                    "new tab."
               + (f" {hidden} selected run(s) not shown stay selected, not acted on." if hidden else ""))


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
            select_runs(sorted(selected_ids() - {run["id"]}))
            st.rerun(scope="app")


runs_table()
