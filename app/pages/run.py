"""Run: live per-rank charts, progress, ETA and cost, attempts, each rank's log tail, Cancel."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from app import charts, data
from app.format import badge, clock, duration, usd
from db.states import TERMINAL, RunStatus
from orchestrator.logs import launcher_log, rank_log_files, tail

CHART_ORDER = ["loss", "eval_accuracy", "eval_loss", "samples_per_s", "step_time"]

runs = data.list_runs()
if not runs:
    st.title("Run")
    st.info("No runs yet. Start one on the **New run** page.")
    st.stop()

ids = [r["id"] for r in runs]
requested = st.query_params.get("run")
default_id = int(requested) if requested and requested.isdigit() and int(requested) in ids else ids[0]
run_id = st.selectbox(
    "Run", ids, index=ids.index(default_id),
    # No status here: the picker is drawn once per full script run, so it would go stale while
    # the live panel below moves on (it showed STARTING beside a SUCCEEDED badge).
    format_func=lambda i: next(f"#{r['id']} {r['name']}" for r in runs if r["id"] == i),
)
st.query_params["run"] = str(run_id)


def header(d: dict) -> None:
    st.markdown(f"## #{d['id']} {d['name']} &nbsp; {badge(d['status'])}")
    if d["status_reason"]:
        st.caption(d["status_reason"])
    st.progress(d["progress"], text=f"step {d['step']} / {d['max_steps']}")
    c = st.columns(5)
    c[0].metric("Elapsed", duration(d["elapsed_s"]))
    c[1].metric("ETA", duration(d["eta_s"]))
    c[2].metric("Cost so far", usd(d["cost_usd"]), help=d["price_unit"])
    c[3].metric("Attempts", d["attempt_count"])
    acc = d["metrics"].get("eval_accuracy", {}).get("0")
    c[4].metric("Eval accuracy", f"{acc:.3f}" if acc is not None else "–")


def metric_charts(d: dict) -> None:
    keys = data.metric_keys(d["id"])
    if not keys:
        st.info("Waiting for the first metrics from the ranks…" if d["status"] not in {s.value for s in TERMINAL}
                else "This run reported no metrics.")
        return
    ordered = [k for k in CHART_ORDER if k in keys] + [k for k in keys if k not in CHART_ORDER and k != "epoch"]
    cols = st.columns(2)
    for i, key in enumerate(ordered):
        frame = data.metric_frame(d["id"], key)
        with cols[i % 2]:
            st.altair_chart(charts.per_rank_line(frame, key), width="stretch")


def attempts_table(d: dict) -> None:
    if not d["attempts"]:
        st.caption("Not launched yet.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "attempt": a["number"], "status": a["status"], "exit code": a["exit_code"],
                    "started": clock(a["started_at"]), "first step": clock(a["first_step_at"]),
                    "ended": clock(a["ended_at"]), "last step": a["last_step"], "reason": a["reason"],
                }
                for a in d["attempts"]
            ]
        ),
        hide_index=True,
    )


def log_tails(d: dict) -> None:
    if not d["attempts"]:
        return
    attempt_dir = Path(d["attempts"][-1]["dir"])
    files = rank_log_files(attempt_dir)
    tabs = st.tabs([f"rank {r}" for r in files] + ["launcher"])
    for tab, (rank, paths) in zip(tabs, files.items()):
        with tab:
            for path in paths:
                st.caption(path.name)
                st.code(tail(path, 6000) or "(empty)", language=None)
    with tabs[-1]:
        st.code(tail(launcher_log(attempt_dir), 6000) or "(empty)", language=None)


def actions(d: dict) -> None:
    if d["status"] in (RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.RETRYING):
        if st.button("Cancel run", icon=":material/stop:", key=f"cancel-{d['id']}"):
            st.toast(data.cancel_run(d["id"]))


@st.fragment(run_every=2)
def live() -> None:
    d = data.run_detail(run_id)
    if d is None:
        st.error(f"Run {run_id} does not exist.")
        return
    header(d)
    actions(d)
    metric_charts(d)
    st.subheader("Attempts")
    attempts_table(d)
    with st.expander("Logs (tail of each rank)", expanded=d["status"] == RunStatus.FAILED):
        log_tails(d)
    with st.expander("Config"):
        st.json(d["config"])


live()
