"""Text for people: durations, money, steps, ETAs and a run's whereabouts, shared by the CLI and
the UI (the UI's own Streamlit markup, such as status badges, is app/style.py)."""

from __future__ import annotations

import datetime as dt
import signal
import time
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from db.states import TERMINAL, AttemptPhase, RunStatus
from db.vocabulary.queue_forecast import Start, queue_end
from orchestrator.executors.slurm.commands import QUEUED_JOB_STATES

if TYPE_CHECKING:
    from db.estimates import StartEstimate

def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = round(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


def phases_text(phases: list[dict[str, Any]] | None) -> str | None:
    """An attempt's start-up (and the recovery before it) by phase, in the order they happened
    (db/vocabulary/phases.py): "teardown 0.4s · detect 0.6s · ... · first_step 0.1s = 5.2s"; None without
    phases."""
    if not phases:
        return None
    parts = " · ".join(f"{p['phase']} {p['seconds']:.1f}s" for p in phases)
    return f"{parts} = {sum(p['seconds'] for p in phases):.1f}s"


def clock(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else "–"


def usd(x: float | None) -> str:
    if x is None:
        return "–"
    return f"${x:,.4f}" if x < 1 else f"${x:,.2f}"


# Why an ended attempt has no exit code, by its status (db.states.AttemptStatus).
NO_EXIT_CODE = {"CRASHED": "killed or vanished", "CANCELLED": "cancelled", "PAUSED": "paused"}


def exit_text(status: str, exit_code: int | None) -> str:
    """How an attempt's launcher ended, for people: ``exit 0``, ``exit -9 (SIGKILL)``, ``still
    running``, or ``no exit code (killed or vanished)``: never "None"."""
    if exit_code is None:
        if status == "RUNNING":
            return "still running"
        why = NO_EXIT_CODE.get(status)
        return f"no exit code ({why})" if why else "no exit code"
    if exit_code < 0:
        try:
            return f"exit {exit_code} ({signal.Signals(-exit_code).name})"
        except ValueError:  # not a signal this platform names
            return f"exit {exit_code}"
    return f"exit {exit_code}"


NOTE_CHARS = 80  # a note's first characters in a table cell or a list line; the Run page shows it whole


def note_line(note: str | None) -> str:
    """A run's note for a table cell: its first line, cut at ``NOTE_CHARS`` with an ellipsis where
    there is more; "" without a note."""
    if not note:
        return ""
    line = note.strip().splitlines()[0]
    more = len(line) > NOTE_CHARS or len(note.strip().splitlines()) > 1
    return line[:NOTE_CHARS].rstrip() + "…" if more else line


def runyard_version() -> str:
    """The installed runyard's version, or a sentence saying it is not installed."""
    try:
        return version("runyard")
    except PackageNotFoundError:
        return "unknown (not installed)"


def eta_text(status: str, eta_s: float | None, eta_range_s: tuple[float, float] | list[float] | None,
             now: float | None = None, *, short: bool = False) -> str:
    """The ETA as a person reads it: the time of day it ends, how long until then and the range
    the recent pace spans (``14:05 (in 4m 10s, 3m 50s-4m 40s)``); ``-`` when it does not apply
    (finished, queued, no pace yet, no total)."""
    if eta_s is None or RunStatus(status) in TERMINAL:
        return "–"
    now = time.time() if now is None else now
    at = day_clock(now + eta_s, now)
    if short:
        return f"{at} (in {duration(eta_s)})"
    spread = ""
    if eta_range_s is not None and duration(eta_range_s[0]) != duration(eta_range_s[1]):
        spread = f", {duration(eta_range_s[0])}–{duration(eta_range_s[1])}"
    return f"{at} (in {duration(eta_s)}{spread})"


def day_clock(ts: float, now: float | None = None) -> str:
    """The time of day ``ts`` falls at (``14:05``), with its date when that is not today
    (``Thu 3 Dec 14:05``): an ETA of 20 hours must not read as this afternoon."""
    now = time.time() if now is None else now
    at = dt.datetime.fromtimestamp(ts)
    if at.date() == dt.datetime.fromtimestamp(now).date():
        return at.strftime("%H:%M")
    return f"{at.strftime('%a')} {at.day} {at.strftime('%b %H:%M')}"


def end_words(status: str) -> tuple[str, str]:
    """The labels of a run's end and cost: ``("Ends at", "Cost so far")`` while it may go on,
    ``("Ended at", "Cost")`` once it has ended (succeeded, failed, cancelled, paused, pruned)."""
    return ("Ended at", "Cost") if RunStatus(status) in TERMINAL else ("Ends at", "Cost so far")


def end_text(status: str, ended_at: float | None, eta_s: float | None,
             eta_range_s: tuple[float, float] | list[float] | None, now: float | None = None) -> str:
    """When a run ends (:func:`eta_text`) or, once it has ended, when it did (``14:05``, with the date
    when not today); ``–`` when neither is known."""
    if RunStatus(status) in TERMINAL:
        return day_clock(ended_at, now) if ended_at else "–"
    return eta_text(status, eta_s, eta_range_s, now)


def end_help(status: str, ends: str, basis: str | None) -> str:
    """What the end tile's help says: the ETA in full and what it is based on; when the run ended;
    or why there is no ETA yet."""
    if RunStatus(status) in TERMINAL:
        return f"The run ended at {ends}" if ends != "–" else "The run ended before it started"
    if ends == "–":
        return "Shown once the run has a pace and a total number of steps"
    return f"{ends}: {basis}" if basis else ends


def step_text(step: int, total: int | None, sep: str = "/") -> str:
    """``12/300``; just ``12`` when the total is not known (0: a script that gave none)."""
    return f"{step}{sep}{total}" if total else f"{step}"


def status_words(status: str, step: int, trial: dict[str, Any] | None) -> str:
    """A run's state as the Runs list and the Run page's badge say it: its status, or for a sweep's
    trial stopped early (PRUNED, where a paused run says PAUSED) ``stopped early at step 40 by sweep 3``."""
    if status == RunStatus.PRUNED and trial is not None:
        return f"stopped early at step {step} by sweep {trial['sweep_id']}"
    return status


def startup_text(status: str, attempt: dict[str, Any] | None, config: dict[str, Any],
                 now: float | None = None) -> str | None:
    """What a launched run does before its first step, in the words a person waiting for it
    needs (``Launching: torchrun starts 2 ranks and they join each other (rendezvous), 4s``);
    ``None`` once it trains, and before or after it runs.

    Args:
        status: the run's status.
        attempt: its newest attempt (``db.queries.attempts_of``), or None.
        config: the run's config (``RunConfig.as_dict()``).
    """
    if status not in (RunStatus.STARTING, RunStatus.RUNNING) or attempt is None or attempt["first_step_at"]:
        return None
    if attempt["ended_at"] or attempt["phase"] == AttemptPhase.FINISHING:
        return None
    now = time.time() if now is None else now
    launch = config.get("launch", {})
    ranks = (launch.get("nproc_per_node") or 1) * (launch.get("nnodes") or 1)
    since = f" ({duration(now - attempt['started_at'])} since launch)" if attempt.get("started_at") else ""
    if attempt.get("job_state") in QUEUED_JOB_STATES:
        reason = attempt.get("job_reason")
        why = f" ({reason})" if reason and reason != "None" else ""
        return (f"Queued on Slurm: job {attempt.get('job_id')} waits for its allocation{why}; submitted "
                f"{duration(now - attempt['started_at'])} ago")
    if attempt["phase"] == AttemptPhase.SETUP:
        restoring = f", restoring step {attempt['resume_step']}" if attempt.get("resume_step") else ""
        return f"Setting up: loading the data and building the model{restoring}{since}"
    if attempt["phase"] == AttemptPhase.FIRST_STEP:
        if config.get("train", {}).get("compile"):
            return f"Compiling: torch.compile traces the model during the first step (slow once){since}"
        return f"First step: the ranks run it and report{since}"
    if config.get("workload", {}).get("kind") == "script":
        return (f"Launching: torchrun starts {ranks} rank(s) of the script; waiting for its first step "
                f"or output{since}")
    return (f"Launching: torchrun starts {ranks} rank(s), they import torch and join each other "
            f"(rendezvous){since}")


def estimate_text(e: StartEstimate) -> str:
    """The New run page's line before Start: how long and how much, and where the pace comes from
    (``About 1m 12s and $0.0072: 3,000 steps at 50 steps/s as run #4 digits-ddp trained, plus 12s
    to start; at $0.36 per hour (2/2 of a CPU node @ $0.36/h).``)."""
    price = f"${e.usd_per_hour:.4g} per hour ({e.price_unit})"
    if e.steps_per_s is None:
        return (f"no earlier run of this workload with these ranks has trained here, so no time yet. It will cost "
                f"{price}; the Run page shows the ETA once it trains.")
    source = (f"as run #{e.like_run} {e.like_name} trained" if e.exact else
              f"as run #{e.like_run} {e.like_name} trained with other settings (rough)")
    if e.seconds is None:
        return (f"{e.steps_per_s:.3g} steps/s {source}; the script's total of steps is not known before it runs. "
                f"It will cost {price}.")
    start = f", plus {duration(e.startup_s)} to start" if e.startup_s else ""
    steps = f"{e.steps:,} steps"
    if e.from_step:  # a fork or a resume trains from its checkpoint to the end
        steps += f" (from step {e.from_step:,} to {e.from_step + e.steps:,})"
    return (f"About {duration(e.seconds)} and {usd(e.cost_usd)}: {steps} at {e.steps_per_s:.3g} steps/s "
            f"{source}{start}; at {price}.")


# Slurm's commonest reasons for a pending job, in words (others are shown as Slurm says them).
_PENDING_REASONS = {
    "Resources": "waiting for nodes to free up",
    "Priority": "jobs of higher priority go first",
    "BeginTime": "waiting for its start time",
    "Dependency": "waiting for another job",
    "QOSMaxJobsPerUserLimit": "your QOS allows no more running jobs",
    "ReqNodeNotAvail": "a requested node is unavailable",
}


def where_short(executor: str, job_id: str | None, job_state: str | None) -> str:
    """Where a run runs, for a table cell: ``local``, or ``slurm 42 RUNNING``."""
    if executor != "slurm":
        return "local"
    return " ".join(p for p in ("slurm", job_id, job_state) if p)


def where_text(config: dict[str, Any], attempt: dict[str, Any] | None, now: float | None = None) -> str | None:
    """Where a run runs, for the Run page and ``runyard show``: the Slurm job with its state, the
    reason it waits, its nodes and how old that word is; or the local nodes of a multi-node
    rehearsal. None for a plain local run (nothing to say)."""
    launch = config.get("launch", {})
    nnodes, nproc = int(launch.get("nnodes") or 1), int(launch.get("nproc_per_node") or 1)
    shape = f"{nnodes} node(s) x {nproc} rank(s)"
    if launch.get("executor") != "slurm":
        if nnodes == 1:
            return None
        return (f"On this machine: {shape}, one torchrun agent per node on loopback (a rehearsal of a multi-node "
                "run: the same world, one host)")
    if attempt is None or not attempt.get("job_id"):
        return f"On Slurm: {shape}; not submitted yet"
    now = time.time() if now is None else now
    state = attempt.get("job_state") or "?"
    reason = attempt.get("job_reason")
    parts = [f"On Slurm: job {attempt['job_id']}", shape]
    if state == "PENDING" and reason and reason != "None":
        parts.append(f"PENDING ({reason}: {_PENDING_REASONS[reason]})" if reason in _PENDING_REASONS
                     else f"PENDING ({reason})")
    elif state == "UNKNOWN" and reason:
        parts.append(f"UNKNOWN: {reason}")
    else:
        parts.append(state)
    if attempt.get("job_nodes"):
        parts.append(f"nodes {attempt['job_nodes']}")
    if attempt.get("job_state_at") and not attempt.get("ended_at"):
        parts.append(f"status read {duration(now - attempt['job_state_at'])} ago")
    return " · ".join(parts)



def _time_of_day(at: float, now: float) -> str:
    """``15:40`` today, ``Thu 03 Dec 09:10`` another day."""
    when = dt.datetime.fromtimestamp(at)
    same_day = when.date() == dt.datetime.fromtimestamp(now).date()
    return when.strftime("%H:%M") if same_day else when.strftime("%a %d %b %H:%M")


def start_text(estimate: dict[str, Any] | None, now: float | None = None, *, short: bool = False) -> str:
    """When a queued run should start (the run summary's ``start_estimate``, db/vocabulary/
    queue_forecast.py): ``starts ≈ 15:40, after run 38`` (short, for a table cell), or with how
    long until then and what it rests on; ``""`` for a run that is not queued."""
    if estimate is None:
        return ""
    at, after, basis = estimate["at"], estimate["after_run"], estimate["basis"]
    if at is None:  # a table cell leaves the why to the queue's line and the Run page
        return "start not known" if short else f"start not known: {basis}"
    now = time.time() if now is None else now
    if at <= now:
        return "starts at the scheduler's next look (its devices are free)"
    if short:
        return f"starts ≈ {_time_of_day(at, now)}" + (f", after run {after}" if after is not None else "")
    return f"starts ≈ {_time_of_day(at, now)} (in {duration(at - now)}): {basis}"


def queue_text(starts: dict[int, Start], now: float | None = None) -> str | None:
    """The whole queue in one line, for the Runs page: how many runs wait and when the last of
    those waiting for this machine should be done (``3 run(s) queued here; all done ≈ 17:20 (in
    2h 05m)``); None when nothing is queued."""
    if not starts:
        return None
    now = time.time() if now is None else now
    here = sum(1 for s in starts.values() if s.here)
    if not here:
        return f"{len(starts)} run(s) queued on Slurm (Slurm decides when they start)."
    slurm = f"; {len(starts) - here} on Slurm (Slurm decides when they start)" if here < len(starts) else ""
    end, waits_on = queue_end(starts)
    if end is None:
        return (f"{here} run(s) queued here; when all are done is not known: run {waits_on}'s start or length "
                f"is not known{slurm}.")
    return f"{here} run(s) queued here; all done ≈ {_time_of_day(end, now)} (in {duration(end - now)}){slurm}."
