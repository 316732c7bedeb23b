"""The Run page's panels other than the charts: the failure summary at the top of a failed run,
the checkpoint table with its pins and the Young–Daly advice, the attempts timeline and table,
each rank's log tail, the warnings and errors among the run's events, and the run's energy with
its two cost lines (Your cost, Cloud reference).

Each takes the run detail the live panel read once for this refresh (``data.run_detail``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from app import data, style
from app.charts import metric as charts
from app.log_view import FRAME, OWN_FRAME_ROOTS, bare, first_error, fold_text, line_rank, log_panel
from app.run_actions import is_superseded
from db.states import TERMINAL_VALUES, RunStatus
from db.vocabulary import metric_registry
from db.vocabulary.your_cost import NO_TARIFF
from orchestrator.cost_text import CLOUD, YOURS, energy_text, tariff_text
from orchestrator.format import clock, duration, end_help, end_text, end_words, exit_text, phases_text, usd


def attempts_table(d: dict[str, Any]) -> None:
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
    st.altair_chart(charts.unvalidated(charts.attempt_timeline(pd.DataFrame(rows))), width="stretch")
    st.dataframe(pd.DataFrame([attempt_row(a) for a in d["attempts"]]), hide_index=True)
    for a in d["attempts"]:  # where each start-up went, phase by phase (db/vocabulary/phases.py)
        if timed := phases_text(a.get("phases")):
            after = "recovery from the failure" if a["phases"][0]["phase"] == "teardown" else "start-up"
            st.caption(f"Attempt {a['number']} {after}: {timed}")


def attempt_row(a: dict[str, Any]) -> dict[str, str | int]:
    """One attempt as the Attempts table shows it: every cell text or a number, "–" where there
    is nothing to say (never "None")."""
    def text(value: Any) -> str:
        return "–" if value is None or value == "" else str(value)

    changes = ", ".join(f"{k}={v}" for sec in a["overrides"].values() for k, v in sec.items())
    return {
        "attempt": a["number"], "status": a["status"], "cause": text(a["cause"]), "rank": text(a["failed_rank"]),
        "exception": text(a["exception"]), "from step": a["resume_step"] or 0, "last step": text(a["last_step"]),
        "steps lost": text(a["steps_lost"]), "exit": exit_text(a["status"], a["exit_code"]),
        "started": clock(a["started_at"]), "first step": clock(a["first_step_at"]), "ended": clock(a["ended_at"]),
        "to detect": duration(a.get("detect_s")), "to first new step": duration(a.get("recovery_s")),
        "retry counted": ("yes" if a["retry_counted"] else "no") if a["cause"] else "–",
        "changes": changes or "–",
    }


def failed_attempt(d: dict[str, Any]) -> dict[str, Any] | None:
    """The newest attempt when it ended in a failure (the run FAILED, or waits to retry)."""
    if d["status"] not in (RunStatus.FAILED, RunStatus.RETRYING) or not d["attempts"]:
        return None
    newest = d["attempts"][-1]
    return newest if newest["cause"] else None


def first_error_line(text: str) -> str | None:
    """The first line of a log that reads as the error (a traceback's start or an exception)."""
    lines = text.splitlines()
    found = first_error(lines)
    if found is None:
        return None
    return bare(lines[found]).strip()


def user_frame(log_tail: str, roots: tuple[str, ...] = OWN_FRAME_ROOTS, rank: int | None = None) -> str | None:
    """Where a traceback in ``log_tail`` left the user's code: its innermost frame that is neither
    runyard's own (``roots``), an installed package's nor Python's (``train.py:12 in step``).
    With ``rank``, only that rank's lines are read (torchrun interleaves every rank's stderr,
    each line with its ``[rankN]:`` prefix; a line without one is taken as the rank's)."""
    where = None
    for line in log_tail.splitlines():
        if rank is not None and line_rank(line) not in (None, rank):
            continue  # another rank's traceback
        m = FRAME.match(bare(line))
        if m is None or m["file"].startswith(roots) or m["file"].startswith("<") or any(
                part in m["file"] for part in ("site-packages/", "dist-packages/", "/lib/python")):
            continue
        func = m["func"] if m["func"] not in (None, "<module>") else None
        where = f"{m['file'].rsplit('/', 1)[-1]}:{m['line']}" + (f" in {func}" if func else "")
    return where


def failure_line(a: dict[str, Any], width: int = 140) -> str:
    """A failed attempt in one line: which rank, the cause, the error's line and where in the
    user's code it was raised (the scheduler's ``exception`` names the innermost frame, which may
    be a library's: the kept traceback's innermost frame of the user's is added then)."""
    rank = f"rank {a['failed_rank']}" if a["failed_rank"] is not None else "the attempt"
    said = [text.strip() for text in (a["exception"], a["reason"]) if text and text.strip()]
    # The exception's last line (its message), else the reason, else the exit as the Attempts table says it.
    what = said[0].splitlines()[-1].strip() if said else exit_text(a["status"], a["exit_code"])
    where = user_frame(a["log_tail"], rank=a["failed_rank"]) if a["log_tail"] else None
    if where and where.split(" ", 1)[0] not in what:
        what += f" (from {where})" if "(at " in what else f" (at {where})"
    what = what if len(what) <= width else what[:width - 1] + "…"
    return f"**Attempt {a['number']}: {rank} failed ({a['cause']})**: {style.plain(what)}"


def failure_summary(d: dict[str, Any]) -> None:
    """A failed run says at the top, in one line, which rank failed with what and where: the label
    of a closed section that holds the traceback runyard kept (the Logs section has the rank's
    whole log), so that the first chart stays in the first screen."""
    a = failed_attempt(d)
    if a is None:
        return
    if not a["log_tail"]:
        st.error(failure_line(a), icon=":material/error:")
        return
    with st.expander(failure_line(a), icon=":material/error:", key="failure"):
        if (line := first_error_line(a["log_tail"])) is not None:
            st.caption(f"First error line: {style.plain(line[:200])}")
        st.code(fold_text(a["log_tail"]), language=None)  # from the user's code: runyard's frames folded
        st.caption("The traceback and the log lines before it; the failing rank's whole log is in the **Logs** "
                   "section.")


def log_tails(d: dict[str, Any]) -> None:
    """The Logs section: the rank logs first (app/log_view.py), following the newest attempt's
    end while the run goes on, opened on the failing rank (rank 0's log is often a red herring:
    it only saw the others stop); then the log tail kept for each attempt that failed."""
    if not d["attempts"]:
        st.caption("Not launched yet: no logs.")
        return
    failed = failed_attempt(d)
    opened = f"rank {failed['failed_rank']}" if failed and failed["failed_rank"] is not None else None
    log_panel(d["id"], d["attempts"], active=d["status"] not in TERMINAL_VALUES, opened=opened)
    for a in d["attempts"]:
        if a["log_tail"]:
            with st.expander(f"Attempt {a['number']}: {style.plain(a['reason'] or 'the log tail runyard kept')}"):
                st.code(fold_text(a["log_tail"]), language=None)


def checkpoint_table(d: dict[str, Any]) -> None:
    """The checkpoint history, newest first, with a pin toggle on each (Resume ▾ and Fork… in the
    header act on a chosen one)."""
    checkpoints = [c for c in d["checkpoints"] if not c["deleted"]]
    deleted = len(d["checkpoints"]) - len(checkpoints)
    if not checkpoints:
        st.caption("No checkpoints yet." + (f" ({deleted} deleted by retention)" if deleted else ""))
        return
    head = st.columns([1, 1, 2, 1, 3, 2, 1])
    for col, title in zip(head, ["step", "attempt", "written", "size", "metrics", "verified", "pinned"], strict=True):
        col.markdown(f"**{title}**")
    for c in reversed(checkpoints):
        row = st.columns([1, 1, 2, 1, 3, 2, 1])
        script = c["source"] == "script"
        row[0].write(f"{c['step']}" + (" (superseded)" if is_superseded(c) else ""))
        row[1].write(str(c["attempt"]))
        row[2].write(clock(c["file_mtime"] if script else c["created_at"]))
        row[3].write(f"{c['bytes'] / 1e6:.1f} MB")
        if script:  # a file the script wrote itself: which one, and its hash
            row[4].write(f"script's file {style.plain(c['origin'])}, sha256 {(c['sha256'] or 'pending')[:12]}"
                         + (" (pinned copy)" if c["path"] != c["origin"] else ""))
        else:
            row[4].write(", ".join(f"{style.plain(metric_registry.label(k))} {metric_registry.format_value(k, v)}"
                                   for k, v in c["metrics"].items() if v is not None) or "–")
        row[5].write(verified_words(c))
        row[6].toggle("pin", value=c["pinned"], key=f"pin-{c['id']}", on_change=pin_changed,
                      args=(d["id"], c["id"], f"pin-{c['id']}"),
                      help="Pinned checkpoints are never deleted" + (
                          "; the script's file is copied into the run's folder, out of its reach" if script else ""))
    refused = st.session_state.pop(f"pin-refused-{d['id']}", None)
    if refused:
        st.error(style.plain(refused), icon=":material/error:")
    if deleted:
        st.caption(f"{deleted} older checkpoint(s) deleted by retention; `runyard show {d['id']}` lists them.")


def verified_words(c: dict[str, Any]) -> str:
    """A checkpoint's "verified" cell: yes; yes but not the run's own (why, and whose it probably
    is: never chosen automatically); or no, and why."""
    reason = style.plain(c["refused_reason"] or "")
    if c["verified"]:
        return f"yes; not this run's own: {reason}" if reason else "yes"
    return f"no: {reason or 'being hashed'}"


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
        st.caption(f"Young–Daly checkpoint interval: not enough data yet: {style.plain('; '.join(a['missing']))}. "
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


def events_list(d: dict[str, Any]) -> None:
    events = [e for e in d["events"] if e["level"] in ("warning", "error")]
    if not events:
        return
    with st.expander(f"Warnings and errors ({len(events)})"):
        st.dataframe(pd.DataFrame([{"time": clock(e["at"]), "attempt #": e["attempt"], "level": e["level"],
                                    "kind": e["kind"], "message": e["message"]} for e in events]),
                     hide_index=True, width="stretch")



SETTINGS_PAGE = "views/settings.py"


def end_tile(column: Any, d: dict[str, Any]) -> None:
    """When the run ends ("Ends at", its basis in the help) or, once it has ended, when it did ("Ended at")."""
    label, _ = end_words(d["status"])
    ends = end_text(d["status"], d["ended_at"], d["eta_s"], d["eta_range_s"])
    column.metric(label, ends.split(" (")[0], help=style.plain(end_help(d["status"], ends, d.get("eta_basis"))))


def energy_tile(column: Any, d: dict[str, Any]) -> None:
    """The run's energy as a headline number: kWh with its method, or "–" (not measured)."""
    energy = d.get("energy") or {}
    value = f"{energy['kwh']:.3g} kWh" if energy.get("kwh") is not None else "–"
    column.metric("Energy", value, help=style.plain(energy_text(energy)))


GOODPUT_PARTS = {"startup": "start-up (launch to first step)", "checkpoints": "checkpoint saves",
                 "failures": "failures (work redone, waits before retries)", "other": "evaluation, logging, slow steps"}


def goodput_tile(column: Any, d: dict[str, Any]) -> None:
    """Productive step time as a share, what the rest went to in its help."""
    parts = d.get("goodput_parts") or {}
    split = "; ".join(f"{GOODPUT_PARTS[k]} {v:.0%}" for k, v in parts.items() if k in GOODPUT_PARTS)
    column.metric("Goodput", f"{d['goodput']:.0%}" if d["goodput"] is not None else "–",
                  help="Productive step time over the time the run held devices or waited to retry"
                       + (f". The rest: {split}. On a short run, start-up alone is a large share." if split else ""))


def has_eval(d: dict[str, Any]) -> bool:
    """Whether the run can show an eval accuracy: a built-in workload evaluates; a script only
    when it logged one (else the tile would wait for a number that never comes)."""
    return d["config"]["workload"]["kind"] != "script" or "eval_accuracy" in d["metrics"]


def headline(d: dict[str, Any]) -> None:
    """The headline numbers in one row of tiles, the run's two costs (Your cost, Cloud
    reference: side by side, never added) among them, then one line of what each cost is made
    of. One row, so that the first chart of the section below shows whole in the first screen."""
    tiles: list[Callable[[Any], None]] = [
        lambda c: c.metric("Elapsed", duration(d["elapsed_s"])),
        lambda c: end_tile(c, d),
        lambda c: c.metric("Attempts", d["attempt_count"]),
        lambda c: energy_tile(c, d),
    ]
    if has_eval(d):
        acc = d["metrics"].get("eval_accuracy", {}).get("0")
        tiles.append(lambda c: c.metric(metric_registry.label("eval_accuracy"),
                                        metric_registry.format_value("eval_accuracy", acc)))
    tiles += [lambda c: goodput_tile(c, d), *cost_tiles(d)]
    # The cost tiles a little wider: at 800 px an equal eighth broke "Cloud reference" mid-word.
    widths = [1.0] * (len(tiles) - 2) + [1.3, 1.3]
    with st.container(key="headline"):
        for tile, column in zip(tiles, st.columns(widths), strict=True):
            tile(column)
        cost_strip(d)


def cost_tiles(d: dict[str, Any]) -> list[Callable[[Any], None]]:
    """The two cost tiles: "Your cost" (its energy at your tariff and PUE plus your hardware's
    amortisation, from Settings) and "Cloud reference" (its device time at the list price it was
    submitted with); "–" for yours without a tariff."""
    yours, cloud = d["cost"]["yours"], d["cost"]["cloud_reference"]
    if yours["usd"] is None:
        def mine(c: Any) -> None:
            c.metric(YOURS, "–", help="Energy x your tariff x PUE + device-hours x your hardware's cost an hour")
    else:
        energy = _energy_part(yours)

        def mine(c: Any) -> None:
            c.metric(YOURS, usd(yours["usd"]), help=style.plain(
                f"Hardware {usd(yours['hardware_usd_per_gpu_hour'])} per GPU-hour x {yours['devices']:g} "
                f"device(s), from Settings; {energy}"))

    def theirs(c: Any) -> None:
        c.metric(CLOUD, usd(cloud["usd"]), help=style.plain(f"Device time at {cloud['unit']}, the list price "
                                                           "the run was submitted at (Settings' price table)"))
    return [mine, theirs]


def _energy_part(yours: dict[str, Any]) -> str:
    return (f"energy {usd(yours['energy_usd'])} ({yours['energy_kwh']:.3g} kWh at "
            f"{tariff_text(yours['usd_per_kwh'], yours['pue'])})"
            if yours["energy_usd"] is not None else "energy not measured: the hardware part only")


def cost_strip(d: dict[str, Any]) -> None:
    """One line under the tiles: "Cost so far" (then "Cost"), what each of the two costs is made
    of, its wasted part and, while the run goes on, its projected total; without a tariff, a
    link to Settings instead of yours."""
    yours, cloud = d["cost"]["yours"], d["cost"]["cloud_reference"]
    going = d["status"] not in TERMINAL_VALUES
    with st.container(horizontal=True, vertical_alignment="center", gap="small", key="cost-panel"):
        head = f"**{end_words(d['status'])[1]}** · {YOURS}: "  # "Cost so far" while it may go on, then "Cost"
        if yours["usd"] is None:
            st.caption(head + ("No electricity tariff set, so no cost of yours." if yours["reason"] == NO_TARIFF
                               else style.plain(yours["reason"])), width="content")
            st.page_link(SETTINGS_PAGE, label="Set your tariff in Settings", icon=":material/settings:",
                         width="content")
        else:
            st.caption(head + _parts(f"{_energy_part(yours)} + hardware {usd(yours['hardware_usd'])}", yours, going),
                       width="content")
        st.caption(f"{CLOUD}: " + _parts(cloud["unit"], cloud, going), width="content")


def _parts(head: str, line: dict[str, Any], going: bool) -> str:
    """A cost line's caption: what it is made of, its wasted part, and its projected total while
    the run goes on."""
    text = f"{head} · wasted {usd(line['wasted_usd'])}"
    return style.plain(text + (f" · projected {usd(line['projected_usd'])}" if going else ""))
