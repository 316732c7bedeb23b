"""Runs: every run with its status, progress, elapsed time, ETA, cost so far and projected, live."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import data, run_actions, style
from app.alerts_panel import alert_mark, open_alerts
from app.style import STATUS_BADGE
from db.compare import MAX_RUNS as MAX_COMPARED  # not app.compare_charts: the Runs page loads no Altair
from db.states import RunStatus
from orchestrator.format import duration, eta_text, step_text, usd, where_short

style.apply()

OPEN_RUN = "runs_open_run"
COMPARE_RUNS = "runs_compare_ids"  # not a widget key: the Compare button is "runs_compare"
# The status cell as a badge, in the Run page's badge colours: (background, text).
BADGE_CSS = {"gray": ("#e8eaed", "#3c4043"), "blue": ("#d2e3fc", "#174ea6"), "orange": ("#feefc3", "#b06000"),
             "green": ("#ceead6", "#0d652d"), "red": ("#fad2cf", "#a50e0e"), "violet": ("#e9d7fe", "#5b2c99")}


def status_css(status: str) -> str:
    background, text = BADGE_CSS[STATUS_BADGE.get(status, ("gray", ""))[0]]
    return f"background-color: {background}; color: {text}"


if (chosen := st.session_state.pop(OPEN_RUN, None)) is not None:
    run_actions.open_run(chosen)
if (compared := st.session_state.pop(COMPARE_RUNS, None)) is not None:
    st.switch_page("views/compare.py", query_params={"runs": ",".join(map(str, compared))})

st.title("Runs")
c1, c2 = st.columns(2)
statuses = c1.multiselect("Status", [s.value for s in RunStatus], placeholder="all statuses")
all_tags = sorted({t for r in data.list_runs() for t in r["tags"]})
tags = c2.multiselect("Tags", all_tags, placeholder="any tag")


@st.fragment(run_every=2)
def runs_table() -> None:
    runs = [r for r in data.list_runs(tuple(statuses)) if not tags or set(tags) & set(r["tags"])]
    if not runs:
        st.info("No runs yet. Start one on the **New run** page, or `runyard submit examples/digits.toml`.")
        st.page_link("views/new_run.py", label="New run", icon=":material/add_circle:")
        return
    marks = open_alerts()
    frame = pd.DataFrame(
        {
            "run": [f"run?run={r['id']}" for r in runs],
            "id": [r["id"] for r in runs],
            "name": [r["name"] for r in runs],
            "status": [r["status"] for r in runs],
            "alert": [alert_mark(r["id"], marks) for r in runs],
            "progress": [r["progress"] for r in runs],
            "step": [step_text(r["step"], r["max_steps"]) for r in runs],
            "elapsed": [duration(r["elapsed_s"]) for r in runs],
            "ends at": [eta_text(r["status"], r["eta_s"], r["eta_range_s"], short=True) for r in runs],
            "cost": [usd(r["cost_usd"]) for r in runs],
            "projected": [usd(r["cost_projected_usd"]) for r in runs],
            "attempts": [r["attempt_count"] for r in runs],
            "where": [where_short(r["executor"], r["job_id"], r["job_state"]) for r in runs],
            "tags": [", ".join(r["tags"]) for r in runs],
        }
    )
    event = st.dataframe(
        frame.style.map(status_css, subset=["status"]),
        hide_index=True,
        column_config={
            "run": st.column_config.LinkColumn("run", display_text=r"run\?run=(\d+)"),
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
            # Wide enough for "17:40 (in 1h 2m 3s)": the automatic width cut it at every width (issue 29).
            "ends at": st.column_config.TextColumn("ends at", width="medium"),
            "cost": st.column_config.TextColumn("cost", help="So far, every attempt included"),
            "projected": st.column_config.TextColumn("projected", help="Cost so far + ETA x the run's price"),
            "alert": st.column_config.TextColumn("alert", help="An open alert (docs/ALERTS.md): its triggers"),
        },
        on_select="rerun",
        selection_mode="multi-row",
        key="runs_table",
    )
    selected = [runs[i]["id"] for i in event.selection.rows if i < len(runs)]
    selection_actions(sorted(selected))


def selection_actions(selected: list[int]) -> None:
    """Open one selected run, or compare the selected ones (up to the Compare page's limit).

    st.switch_page does not leave a fragment: the choice is kept in the session and the whole
    page reruns and switches (opened in this browser session, the page draws without a new
    tab's start-up)."""
    c1, c2, c3 = st.columns([1, 1, 3], vertical_alignment="center")
    if c1.button(f"Open run #{selected[0]}" if len(selected) == 1 else "Open run", disabled=len(selected) != 1,
                 key="runs_open", icon=":material/open_in_browser:"):
        st.session_state[OPEN_RUN] = selected[0]
        st.rerun(scope="app")
    too_many = len(selected) > MAX_COMPARED
    if c2.button(f"Compare {len(selected)} runs" if len(selected) > 1 else "Compare", type="primary",
                 disabled=len(selected) < 2 or too_many, key="runs_compare", icon=":material/stacked_line_chart:"):
        st.session_state[COMPARE_RUNS] = selected
        st.rerun(scope="app")
    c3.caption(f"Compare takes at most {MAX_COMPARED} runs: unselect {len(selected) - MAX_COMPARED}." if too_many
               else "Select rows (the boxes on the left) to open one run or compare several; the link in the "
                    "*run* column opens a run in a new tab.")


runs_table()
