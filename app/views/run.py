"""Run: live per-rank charts, progress, ETA and cost, attempts, each rank's log tail, Cancel."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import streamlit as st

from app import charts, data
from app.format import badge, clock, duration, usd
from db.states import TERMINAL, RunStatus
from db.requests import RequestRefused
from orchestrator.logs import launcher_log, rank_log_files, tail
from trainer.config import ConfigError

CHART_ORDER = ["loss", "eval_accuracy", "eval_loss", "samples_per_s", "step_time"]
TERMINAL_VALUES = {s.value for s in TERMINAL}

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
show_superseded = st.toggle("Show superseded steps", value=False,
                            help="What abandoned attempts logged after the step the run was resumed from")


def header(d: dict) -> None:
    st.markdown(f"## #{d['id']} {d['name']} &nbsp; {badge(d['status'])}")
    if d["status_reason"]:
        st.caption(d["status_reason"])
    st.progress(d["progress"], text=f"step {d['step']} / {d['max_steps']}")
    if d["status"] == RunStatus.RETRYING and d["retry_at"]:
        st.warning(f"Retrying: next attempt at {clock(d['retry_at'])} (retries used: {d['retries_used']}).",
                   icon=":material/refresh:")
    c = st.columns(6)
    c[0].metric("Elapsed", duration(d["elapsed_s"]))
    c[1].metric("ETA", duration(d["eta_s"]))
    c[2].metric("Cost so far", usd(d["cost_usd"]), help=d["price_unit"])
    c[3].metric("Attempts", d["attempt_count"])
    acc = d["metrics"].get("eval_accuracy", {}).get("0")
    c[4].metric("Eval accuracy", f"{acc:.3f}" if acc is not None else "–")
    c[5].metric("Goodput", f"{d['goodput']:.0%}" if d["goodput"] is not None else "–",
                help="Productive step time over the time the run held devices or waited to retry")


def metric_charts(d: dict, show_superseded: bool) -> None:
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
            st.altair_chart(charts.per_rank_line(frame, key, show_superseded=show_superseded), width="stretch")


def attempts_table(d: dict) -> None:
    """The attempts as a timeline: how each ended, on which rank, what it cost in steps and time."""
    if not d["attempts"]:
        st.caption("Not launched yet.")
        return
    now = time.time()
    rows = []
    for a in d["attempts"]:
        outcome = "PREEMPTED" if a["cause"] == "PREEMPTED" else ("FAILED" if a["status"] == "CRASHED" else a["status"])
        rows.append({
            "attempt": a["number"], "outcome": outcome, "cause": a["cause"] or "",
            "start": pd.to_datetime(a["started_at"], unit="s"), "end": pd.to_datetime(a["ended_at"] or now, unit="s"),
            "steps": f"{a['resume_step'] or 0}–{a['last_step'] or a['resume_step'] or 0}", "reason": a["reason"] or "",
        })
    st.altair_chart(charts.attempt_timeline(pd.DataFrame(rows)), width="stretch")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "attempt": a["number"], "status": a["status"], "cause": a["cause"], "rank": a["failed_rank"],
                    "exception": a["exception"], "from step": a["resume_step"], "last step": a["last_step"],
                    "steps lost": a["steps_lost"], "exit code": a["exit_code"],
                    "started": clock(a["started_at"]), "first step": clock(a["first_step_at"]), "ended": clock(a["ended_at"]),
                    "to detect": duration(a.get("detect_s")),
                    "to first new step": duration(a.get("recovery_s")),
                    "retry counted": a["retry_counted"] if a["cause"] else None,
                    "changes": ", ".join(f"{k}={v}" for sec in a["overrides"].values() for k, v in sec.items()) or None,
                }
                for a in d["attempts"]
            ]
        ),
        hide_index=True,
    )
    for a in d["attempts"]:
        if a["log_tail"]:
            with st.expander(f"Attempt {a['number']}: {a['reason']}"):
                st.code(a["log_tail"], language=None)


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


def checkpoint_table(d: dict) -> None:
    """The checkpoint history with a Resume button on every usable checkpoint."""
    checkpoints = [c for c in d["checkpoints"] if not c["deleted"]]
    deleted = len(d["checkpoints"]) - len(checkpoints)
    if not checkpoints:
        st.caption("No checkpoints yet." + (f" ({deleted} deleted by retention)" if deleted else ""))
        return
    active = d["status"] not in {s.value for s in TERMINAL}
    head = st.columns([1, 1, 2, 1, 3, 1, 2, 1])
    for col, title in zip(head, ["step", "attempt", "written", "size", "metrics", "verified", "", ""]):
        col.markdown(f"**{title}**")
    for c in reversed(checkpoints):
        row = st.columns([1, 1, 2, 1, 3, 1, 2, 1])
        superseded = "/superseded/" in c["path"]
        row[0].write(f"{c['step']}" + (" (superseded)" if superseded else ""))
        row[1].write(str(c["attempt"]))
        row[2].write(clock(c["created_at"]))
        row[3].write(f"{c['bytes'] / 1e6:.1f} MB")
        row[4].write(", ".join(f"{k} {v:.4g}" for k, v in c["metrics"].items() if v is not None) or "–")
        row[5].write("yes" if c["verified"] else f"no: {c['refused_reason']}")
        if row[6].button("Resume from here", key=f"resume-{c['id']}", icon=":material/replay:",
                         disabled=active or not c["verified"],
                         help="Cancel the run first" if active else f"New attempt from step {c['step']}"):
            st.toast(data.resume_run(d["id"], c["id"]))
            st.rerun()
        pinned = row[7].toggle("pin", value=c["pinned"], key=f"pin-{c['id']}", help="Pinned checkpoints are never deleted")
        if pinned != c["pinned"]:
            data.pin_checkpoint(d["id"], c["id"], pinned)
    if deleted:
        st.caption(f"{deleted} older checkpoint(s) deleted by retention; `runyard show {d['id']}` lists them.")


def fork_form(d: dict) -> None:
    usable = sorted({c["step"] for c in d["checkpoints"] if c["verified"] and not c["deleted"]}, reverse=True)
    if not usable:
        return
    with st.form(f"fork-{d['id']}"):
        st.markdown("**Fork**: a new run that starts from a checkpoint of this one, with changed settings.")
        step = st.selectbox("From checkpoint step", usable, key=f"fork-step-{d['id']}")
        changes = st.text_area("Changed settings, one `key=value` per line", value="train.lr=0.0001",
                               key=f"fork-set-{d['id']}")
        if st.form_submit_button("Fork", icon=":material/call_split:"):
            overrides = [line.strip() for line in changes.splitlines() if line.strip()]
            try:
                new_id = data.fork_run(d["id"], int(step), overrides)
            except (ConfigError, RequestRefused) as exc:
                st.error(str(exc))
            else:
                st.switch_page("views/run.py", query_params={"run": str(new_id)})


def actions(d: dict) -> None:
    status = d["status"]
    cols = st.columns(4)
    if status in (RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.RETRYING):
        if cols[0].button("Cancel run", icon=":material/stop:", key=f"cancel-{d['id']}",
                          help="SIGTERM: the ranks finish the step, checkpoint and exit"):
            st.toast(data.cancel_run(d["id"]))
            st.rerun()  # show the new status now, not at the next refresh
    if status in (RunStatus.STARTING, RunStatus.RUNNING):
        if cols[1].button("Pause", icon=":material/pause:", key=f"pause-{d['id']}",
                          help="Checkpoint, free the devices; Resume continues from that checkpoint"):
            st.toast(data.cancel_run(d["id"], mode="pause"))
            st.rerun()
        if cols[2].button("Dump stacks", icon=":material/stacks:", key=f"stacks-{d['id']}",
                          help="Save every rank's Python stack into the attempt's folder; nothing is stopped"):
            st.toast(data.dump_stacks(d["id"]))
    usable = any(c["verified"] and not c["deleted"] for c in d["checkpoints"])
    if status in TERMINAL_VALUES and status != RunStatus.SUCCEEDED and usable:
        if cols[0].button("Resume", icon=":material/play_arrow:", type="primary", key=f"resume-latest-{d['id']}",
                          help="A new attempt from the newest verified checkpoint"):
            st.toast(data.resume_run(d["id"]))
            st.rerun()


@st.fragment(run_every=2)
def live() -> None:
    d = data.run_detail(run_id)
    if d is None:
        st.error(f"Run {run_id} does not exist.")
        return
    header(d)
    if d["parent_run_id"]:
        st.caption(f"Forked from run #{d['parent_run_id']} at step {d['parent_step']}.")
    actions(d)
    metric_charts(d, show_superseded)
    st.subheader("Checkpoints")
    checkpoint_table(d)
    st.subheader("Attempts")
    attempts_table(d)
    events = [e for e in d["events"] if e["level"] in ("warning", "error")][:10]
    if events:
        with st.expander(f"Warnings and errors ({len(events)})"):
            for e in events:
                st.markdown(f"`{clock(e['at'])}` **{e['kind']}** {e['message']}")
    with st.expander("Logs (tail of each rank)", expanded=d["status"] == RunStatus.FAILED):
        log_tails(d)
    with st.expander("Config"):
        st.json(d["config"])


live()
detail = data.run_detail(run_id)
if detail is not None:
    fork_form(detail)
