"""Run: live metric charts, event badges, progress, ETA and cost, checkpoints with Young–Daly
advice, attempts, system panels, each rank's log tail and the config on demand, Cancel.

The live fragment keeps each metric's downsampled series in st.session_state and asks the
metric store only for what is new every 2 s (app.data.merge_series).

The first paint is kept cheap for the browser: Streamlit loads an element's code the first
time one is drawn, and the code viewer, the JSON viewer and the slider each cost the browser a
few tenths of a second (BENCHMARKS.md). So the log tails and the config are drawn only while a
toggle asks for them (a collapsed st.expander or st.tabs would still draw them), and the
smoothing slider sits in a popover, which draws its contents when opened."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import pandas as pd
import streamlit as st

from app import chart_widgets, charts, data
from app.system import latest_window, summary_line, system_panels
from db import metric_registry
from db.config import ConfigError
from db.requests import RequestRefused
from db.states import TERMINAL, RunStatus
from orchestrator.format import badge, clock, duration, eta_text, startup_text, step_text, usd
from orchestrator.logs import launcher_log, rank_log_files, tail
from orchestrator.script_supervision import script_facts

CHART_ORDER = ["loss", "eval_accuracy", "eval_loss", "samples_per_s", "step_time"]
TERMINAL_VALUES = {s.value for s in TERMINAL}
# Buckets per (attempt, rank) a chart asks for: about 8000 rows a chart whatever the rank count,
# between 500 and 2000 a line (the store halves resolution in steps of 4, so 1/4 to all of it).
CHART_ROWS, MIN_POINTS, MAX_POINTS = 8000, 500, 2000
# Event kinds shown as badges at the top of the run: (colour, icon, label).
EVENT_BADGES = {
    "straggler": ("orange", ":material/slow_motion_video:", "straggler"),
    "desync": ("red", ":material/sync_problem:", "desync"),
    "nan": ("red", ":material/error:", "NaN"),
    "hang": ("red", ":material/hourglass_disabled:", "hang"),
}

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
    if starting := startup_text(d["status"], d["attempts"][-1] if d["attempts"] else None, d["config"]):
        st.caption(starting)
    st.progress(d["progress"], text=f"step {step_text(d['step'], d['max_steps'], ' / ')}")
    facts = script_facts(d["config"], d["attempts"])
    if facts:
        # Paths as code (they may hold characters Markdown would read); the watchdog's sentence as text.
        st.caption(" · ".join(f"**{label.capitalize()}**: "
                              + (text if label == "hang watchdog watches" else f"`{text}`") for label, text in facts))
    if d["status"] == RunStatus.RETRYING and d["retry_at"]:
        st.warning(f"Retrying: next attempt at {clock(d['retry_at'])} (retries used: {d['retries_used']}).",
                   icon=":material/refresh:")
    failure_summary(d)
    c = st.columns(6)
    c[0].metric("Elapsed", duration(d["elapsed_s"]))
    ends = eta_text(d["status"], d["eta_s"], d["eta_range_s"])
    c[1].metric("Ends at", ends.split(" (")[0], help=f"At the recent pace: {ends}; evaluations and saves included"
                if ends != "–" else "Shown once the run has a pace and a total number of steps")
    c[2].metric("Cost so far", usd(d["cost_usd"]), help=d["price_unit"])
    c[3].metric("Attempts", d["attempt_count"])
    acc = d["metrics"].get("eval_accuracy", {}).get("0")
    c[4].metric("Eval accuracy", f"{acc:.3f}" if acc is not None else "–")
    parts = d.get("goodput_parts") or {}
    named = {"startup": "start-up (launch to first step)", "checkpoints": "checkpoint saves",
             "failures": "failures (work redone, waits before retries)", "other": "evaluation, logging, slow steps"}
    split = "; ".join(f"{named[k]} {v:.0%}" for k, v in parts.items() if k in named)
    c[5].metric("Goodput", f"{d['goodput']:.0%}" if d["goodput"] is not None else "–",
                help="Productive step time over the time the run held devices or waited to retry"
                     + (f". The rest: {split}. On a short run, start-up alone is a large share." if split else ""))


def max_points(nproc: int) -> int:
    return max(MIN_POINTS, min(MAX_POINTS, CHART_ROWS // max(1, nproc)))


def live_series(d: dict) -> dict[str, data.LiveSeries]:
    """Every metric of the run, each merged with what this session already holds (only new
    buckets are fetched), in chart order."""
    keys = data.metric_keys(d["id"])
    ordered = [k for k in CHART_ORDER if k in keys] + [k for k in keys if k not in CHART_ORDER and k != "epoch"]
    newest = d["attempts"][-1] if d["attempts"] else {"number": 0, "resume_step": 0}
    points = max_points(d["nproc"])
    out = {}
    for key in ordered:
        state_key = f"live-series/{d['id']}/{key}"
        out[key] = st.session_state[state_key] = data.merge_series(
            st.session_state.get(state_key),
            partial(data.metric_series, d["id"], key, points),
            max_points=points, attempts=len(d["attempts"]), newest_attempt=newest["number"],
            resume_step=newest["resume_step"] or 0, finished=d["status"] in TERMINAL_VALUES,
        )
    return out


def system_section(d: dict) -> None:
    """The newest system window in one line; its charts (up to 11 with GPUs, each costing the
    browser 0.1-0.3 s to draw) only while the toggle is on."""
    st.subheader("System")
    st.caption(summary_line(latest_window(d["id"])))
    if st.toggle("Show system charts (GPUs, processes, host)", key=f"system-{d['id']}"):
        system_panels(d["id"])


def event_badges(d: dict, series: dict[str, data.LiveSeries]) -> None:
    """A row of badges with counts: stragglers, desyncs, NaNs, hangs. Without a "nan" event
    from the trainer, NaNs are counted from the charts' buckets."""
    counts = dict(data.event_counts(d["id"]))
    if not counts.get("nan"):
        cutoffs = data.lineage_cutoffs(d["attempts"])
        counts["nan"] = sum(int(r.get("nan_count") or 0) for s in series.values() for r in s.rows
                            if r["step"] <= cutoffs.get(r["attempt"], float("inf")))
    shown = [f":{color}-badge[{icon} {label} × {counts[kind]}]"
             for kind, (color, icon, label) in EVENT_BADGES.items() if counts.get(kind)]
    if shown:
        st.markdown(" ".join(shown))
    elif unmonitored(d):
        st.markdown(":gray-badge[:material/help: stragglers, desyncs, NaNs and hangs not checked "
                    "(the script does not use runyard's SDK)]")
    else:
        st.markdown(":green-badge[:material/check: no stragglers, desyncs, NaNs or hangs]")


def unmonitored(d: dict) -> bool:
    """True for a script run whose ranks never reported to runyard (no attempt completed a step
    through the SDK): the straggler, desync, NaN and hang checks all read those reports, so
    none of them ran, and "none found" would be a claim nobody checked."""
    return (d["config"]["workload"]["kind"] == "script" and bool(d["attempts"])
            and all(a["first_step_at"] is None for a in d["attempts"]))


def chart_options(run_id: int, nproc: int, keys: list[str]) -> charts.ChartOptions:
    """The widgets above the charts; the choice is kept per run for this browser session. From
    8 ranks the default is the rank mean with its band; a log y axis is chosen per chart."""
    saved: dict[int, charts.ChartOptions] = st.session_state.setdefault("chart-options", {})
    o = saved.get(run_id, charts.ChartOptions(ranks=charts.default_rank_mode(nproc)))
    c = st.columns([2.5, 3, 2, 2.5])
    ranks = c[0].segmented_control("Ranks", charts.RANK_MODES, default=o.ranks, key=f"ranks-{run_id}")
    x = c[1].segmented_control("X axis", charts.X_AXES, default=o.x, key=f"x-{run_id}")
    smoothing = c[2].popover("Smoothing (EMA)", icon=":material/tune:").slider(
        "EMA weight", 0.0, 0.99, o.smoothing, 0.01, key=f"ema-{run_id}",
        help="Weight of the running average: the smoothed line is drawn over the faint values")
    superseded = c[3].toggle("Show superseded steps", value=o.show_superseded, key=f"superseded-{run_id}",
                             help="What abandoned attempts logged after the step the run was resumed from")
    loggable = [k for k in keys if metric_registry.spec_for(k).log_ok]  # never accuracy or other shares
    log_keys = st.pills("Log scale", loggable, selection_mode="multi", default=sorted(o.log_keys & set(loggable)),
                        format_func=metric_registry.label, key=f"log-{run_id}",
                        help="The charts drawn on a logarithmic y axis (values of zero or less are left out)")
    # A segmented control can be clicked off; keep the last choice then.
    saved[run_id] = charts.ChartOptions(ranks=ranks or o.ranks, x=x or o.x, log_keys=frozenset(log_keys or ()),
                                        smoothing=smoothing, show_superseded=superseded)
    return saved[run_id]


def metric_charts(d: dict, series: dict[str, data.LiveSeries]) -> None:
    if not series:
        if d["status"] in TERMINAL_VALUES:
            st.info("This run reported no metrics.")
        else:  # what it does meanwhile: queued for what, launching, setting up, compiling, first step
            newest = d["attempts"][-1] if d["attempts"] else None
            st.info(startup_text(d["status"], newest, d["config"]) or d["status_reason"]
                    or "Waiting for the first metrics from the ranks…", icon=":material/hourglass_top:")
        return
    options = replace(chart_options(d["id"], d["nproc"], list(series)),
                      isolated=chart_widgets.isolated_ranks(d["id"], d["nproc"]))
    cutoffs = data.lineage_cutoffs(d["attempts"])
    cols = st.columns(2)
    for i, (key, s) in enumerate(series.items()):
        with cols[i % 2]:
            st.altair_chart(charts.metric_view(s.rows, cutoffs, options, key, d["started_at"], bucketed=s.level > 0),
                            width="stretch")
    chart_widgets.latest_table(d["metrics"], list(series))


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
                    "started": clock(a["started_at"]), "first step": clock(a["first_step_at"]),
                    "ended": clock(a["ended_at"]),
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


def failed_attempt(d: dict) -> dict | None:
    """The newest attempt when it ended in a failure (the run FAILED, or waits to retry)."""
    if d["status"] not in (RunStatus.FAILED, RunStatus.RETRYING) or not d["attempts"]:
        return None
    newest = d["attempts"][-1]
    return newest if newest["cause"] else None


def first_error_line(text: str) -> str | None:
    """The first line of a log that reads as the error (a traceback's start or an exception)."""
    for line in text.splitlines():
        stripped = line.split("]:", 1)[-1].strip() if line.startswith("[rank") else line.strip()
        if stripped.startswith("Traceback") or re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", stripped):
            return stripped
    return None


def failure_summary(d: dict) -> None:
    """A failed run says at the top which rank failed, with what, and the traceback runyard kept."""
    a = failed_attempt(d)
    if a is None:
        return
    rank = f"rank {a['failed_rank']}" if a["failed_rank"] is not None else "the attempt"
    what = a["exception"] or a["reason"] or f"exit code {a['exit_code']}"
    st.error(f"**Attempt {a['number']}: {rank} failed ({a['cause']})**: {what}", icon=":material/error:")
    if a["log_tail"]:
        with st.expander("Traceback and the log lines before it", expanded=d["status"] == RunStatus.FAILED):
            if (line := first_error_line(a["log_tail"])) is not None:
                st.caption(f"First error line: `{line[:200]}`")
            st.code(a["log_tail"], language=None)


def log_tails(d: dict) -> None:
    """The log tail kept for each attempt that failed, then each rank's log of the newest attempt."""
    if not d["attempts"]:
        st.caption("Not launched yet: no logs.")
        return
    for a in d["attempts"]:
        if a["log_tail"]:
            with st.expander(f"Attempt {a['number']}: {a['reason']}"):
                st.code(a["log_tail"], language=None)
    attempt_dir = Path(d["attempts"][-1]["dir"])
    files = rank_log_files(attempt_dir)
    failed = failed_attempt(d)
    # Opened on the failing rank (rank 0's log is often a red herring: it only saw the others stop).
    opened = f"rank {failed['failed_rank']}" if failed and failed["failed_rank"] in files else None
    tabs = st.tabs([f"rank {r}" for r in files] + ["launcher"], default=opened)
    # One tab more than ranks: the launcher's, the last, filled below.
    for tab, paths in zip(tabs, files.values(), strict=False):
        with tab:
            for path in paths:
                st.caption(path.name)
                st.code(tail(path, 6000) or "(empty)", language=None)
    with tabs[-1]:
        st.code(tail(launcher_log(attempt_dir), 6000) or "(empty)", language=None)


def logs_and_config(d: dict) -> None:
    """Toggles for the log tails (on by default for a failed run) and the config; each is drawn
    only while its toggle is on, and the logs refresh with the live panel."""
    c = st.columns(2)
    show_logs = c[0].toggle("Show logs (tail of each rank)", value=d["status"] == RunStatus.FAILED,
                            key=f"show-logs-{d['id']}")
    show_config = c[1].toggle("Show config", key=f"show-config-{d['id']}")
    if show_logs:
        st.subheader("Logs")
        log_tails(d)
    if show_config:
        st.subheader("Config")
        st.json(d["config"])


def checkpoint_table(d: dict) -> None:
    """The checkpoint history with a Resume button on every usable checkpoint."""
    checkpoints = [c for c in d["checkpoints"] if not c["deleted"]]
    deleted = len(d["checkpoints"]) - len(checkpoints)
    if not checkpoints:
        st.caption("No checkpoints yet." + (f" ({deleted} deleted by retention)" if deleted else ""))
        return
    active = d["status"] not in {s.value for s in TERMINAL}
    head = st.columns([1, 1, 2, 1, 3, 1, 2, 1])
    for col, title in zip(head, ["step", "attempt", "written", "size", "metrics", "verified", "", ""], strict=True):
        col.markdown(f"**{title}**")
    for c in reversed(checkpoints):
        row = st.columns([1, 1, 2, 1, 3, 1, 2, 1])
        superseded = "/superseded/" in c["path"]
        script = c["source"] == "script"
        row[0].write(f"{c['step']}" + (" (superseded)" if superseded else ""))
        row[1].write(str(c["attempt"]))
        row[2].write(clock(c["file_mtime"] if script else c["created_at"]))
        row[3].write(f"{c['bytes'] / 1e6:.1f} MB")
        if script:  # a file the script wrote itself: which one, and its hash
            row[4].write(f"script's file `{c['origin']}`, sha256 {(c['sha256'] or 'pending')[:12]}"
                         + (" (pinned copy)" if c["path"] != c["origin"] else ""))
        else:
            row[4].write(", ".join(f"{k} {v:.4g}" for k, v in c["metrics"].items() if v is not None) or "–")
        row[5].write("yes" if c["verified"] else f"no: {c['refused_reason'] or 'being hashed'}")
        if row[6].button("Resume from here", key=f"resume-{c['id']}", icon=":material/replay:",
                         disabled=active or not c["verified"],
                         help="Cancel the run first" if active else f"New attempt from step {c['step']}"):
            st.toast(data.resume_run(d["id"], c["id"]))
            st.rerun()
        row[7].toggle("pin", value=c["pinned"], key=f"pin-{c['id']}", on_change=pin_changed,
                      args=(d["id"], c["id"], f"pin-{c['id']}"),
                      help="Pinned checkpoints are never deleted" + (
                          "; the script's file is copied into the run's folder, out of its reach" if script else ""))
    refused = st.session_state.pop(f"pin-refused-{d['id']}", None)
    if refused:
        st.error(refused, icon=":material/error:")
    if deleted:
        st.caption(f"{deleted} older checkpoint(s) deleted by retention; `runyard show {d['id']}` lists them.")


def pin_changed(run_id: int, checkpoint_id: int, key: str) -> None:
    """The pin toggle moved: pin or unpin once; a refusal puts the toggle back (so the page does
    not ask again on every refresh) and is shown once."""
    refused = data.pin_checkpoint(run_id, checkpoint_id, bool(st.session_state[key]))
    if refused:
        st.session_state[key] = not st.session_state[key]
        st.session_state[f"pin-refused-{run_id}"] = refused


def checkpoint_advice(run_id: int) -> None:
    """Young–Daly's interval from the measured save cost and this machine's MTBF."""
    a = data.checkpoint_advice(run_id)
    if a is None:
        return
    configured = ", ".join(
        part for part in (f"every {a['every_steps']} steps" if a["every_steps"] else "",
                          f"every {a['every_seconds']:g} s" if a["every_seconds"] else "") if part
    ) or "only at the end"
    if a["interval_s"] is None:
        st.caption(f"Young–Daly checkpoint interval: not enough data yet: {'; '.join(a['missing'])}. "
                   f"Configured: {configured}.")
        return
    every = (f"every ~{a['interval_steps']:,} steps ({duration(a['interval_s'])})" if a["interval_steps"]
             else f"every ~{duration(a['interval_s'])} (the step time is not known yet)")
    st.caption(
        f"Young–Daly suggests {every} given save cost {a['checkpoint_cost_s']:.2g} s and MTBF "
        f"{a['mtbf_s'] / 3600:.2g} h ({a['failures']} interruption(s) in {a['device_time_s'] / 3600:.2g} h of attempts "
        f"on this machine); configured: {configured}.",
        help="sqrt(2 x save cost x MTBF) minimises the time lost to saves plus the work redone after a failure. "
             "Save cost: median time the training loop was blocked by the newest saves. Interruptions: attempts "
             "killed, crashed, hung or cut off; not bugs or CUDA OOMs (they recur whatever the interval) "
             "nor preemptions (they save first).",
    )


def events_list(d: dict) -> None:
    events = [e for e in d["events"] if e["level"] in ("warning", "error")]
    if not events:
        return
    with st.expander(f"Warnings and errors ({len(events)})"):
        st.dataframe(pd.DataFrame([{"time": clock(e["at"]), "attempt #": e["attempt"], "level": e["level"],
                                    "kind": e["kind"], "message": e["message"]} for e in events]),
                     hide_index=True, width="stretch")


def fork_form(d: dict) -> None:
    usable = sorted((c for c in d["checkpoints"] if c["verified"] and not c["deleted"]),
                    key=lambda c: (c["step"], c["id"]), reverse=True)
    if not usable:
        return
    labels = {c["id"]: f"step {c['step']}" + (f" ({c['origin']}, #{c['id']})" if c["source"] == "script" else "")
              for c in usable}
    with st.form(f"fork-{d['id']}"):
        st.markdown("**Fork**: a new run that starts from a checkpoint of this one, with changed settings.")
        chosen = st.selectbox("From checkpoint", list(labels), format_func=labels.__getitem__,
                              key=f"fork-step-{d['id']}")
        # A script run has no train.* settings (db/config.py refuses them): its example is one it uses.
        example = "checkpoint.keep_last=5" if d["config"]["workload"]["kind"] == "script" else "train.lr=0.0001"
        changes = st.text_area("Changed settings, one `key=value` per line", value=example,
                               key=f"fork-set-{d['id']}")
        if st.form_submit_button("Fork", icon=":material/call_split:"):
            overrides = [line.strip() for line in changes.splitlines() if line.strip()]
            try:
                new_id = data.fork_run(d["id"], -1, overrides, checkpoint_id=int(chosen))
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
    if status in TERMINAL_VALUES and d["config"]["workload"]["kind"] == "script" and not d["imported"]:
        if cols[1].button("Rerun", icon=":material/restart_alt:", key=f"rerun-{d['id']}",
                          help="A new attempt in the same folder without a checkpoint: for a script that keeps "
                               "its own state there"):
            st.toast(data.rerun_run(d["id"]))
            st.rerun()


# A finished run changes only when someone resumes it: look less often (rebuilding the charts
# costs the server some CPU on every refresh).
_listed = next(r for r in runs if r["id"] == run_id)


@st.fragment(run_every=10 if _listed["status"] in TERMINAL_VALUES else 2)
def live() -> None:
    d = data.run_detail(run_id)
    if d is None:
        st.error(f"Run {run_id} does not exist.")
        return
    header(d)
    series = live_series(d)
    event_badges(d, series)
    if d["parent_run_id"]:
        st.caption(f"Forked from run #{d['parent_run_id']} at step {d['parent_step']}.")
    actions(d)
    metric_charts(d, series)
    st.subheader("Checkpoints")
    checkpoint_table(d)
    if d["attempts"]:  # advice about save intervals means nothing before the run has run
        checkpoint_advice(d["id"])
    st.subheader("Attempts")
    attempts_table(d)
    events_list(d)
    system_section(d)
    logs_and_config(d)


live()
detail = data.run_detail(run_id)
if detail is not None:
    fork_form(detail)
