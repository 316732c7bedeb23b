"""Read queries for the UI and the CLI. They return plain data (dicts, lists, DataFrames),
never ORM objects, so that Streamlit can cache them.

A run's summary is db/run_summary.py's, the Runs list db/run_list.py's, goodput and the
checkpoint advice db/efficiency.py's; here, everything else about one run (its detail, attempts,
checkpoints, events, logs and metrics), finding a run by name, the scheduler's status and the
price table."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db import metricstore
from db.efficiency import goodput, goodput_parts
from db.energy import energies
from db.models import Attempt, Checkpoint, Event, PriceEntry, Run, RunStatusHistory, SchedulerHeartbeat
from db.requests import RunNotFound, imported
from db.run_summary import _run_summaries, lineage_cutoffs
from db.states import RunStatus
from db.vocabulary.checks import CHECKS_EVENT, parse_checks
from db.vocabulary.cost import (
    default_prices,
)
from db.vocabulary.phases import attempt_phases, marks_from_json, recovery_s
from db.vocabulary.scheduler_file import read_scheduler_file

HEARTBEAT_STALE_S = 10.0
INT64_MAX = 2**63 - 1


def resolve_run(session: Session, ref: str | int) -> int:
    """A run id from an id (``12``, ``#12``) or a name (the newest run with that name)."""
    return resolve_row(session, Run, ref, lambda what: RunNotFound(f"no run {what}; `runyard ls` lists the runs"))


def resolve_row(session: Session, model: Any, ref: str | int, missing: Callable[[str], Exception]) -> int:
    """The id of the row of ``model`` (a run, a sweep) that ``ref`` names: an id (``12``, ``#12``)
    or a name (the newest with that name).

    Raises:
        Exception: ``missing("with id 12")`` or ``missing("named 'x'")``, when none does.
    """
    text = str(ref).lstrip("#")
    if text.isascii() and text.isdigit():  # "²".isdigit() is true, int("²") is an error
        # Ids are 64-bit; a larger number is no row (and would overflow the query's parameter).
        if int(text) > INT64_MAX or session.get(model, int(text)) is None:
            raise missing(f"with id {text}")
        return int(text)
    found: int | None = session.scalar(select(model.id).where(model.name == text).order_by(model.id.desc()))
    if found is None:
        raise missing(f"named {text!r}")
    return found



def latest_metrics(session: Session, run_id: int,
                   attempts: list[dict[str, Any]] | None = None) -> dict[str, dict[str, float]]:
    """The newest value of each metric on each rank along the run's lineage (what an attempt
    logged after a later attempt's resume step is left out; ``attempts`` as :func:`attempts_of`
    gives them, read when None): ``{"loss": {"0": 0.41, "1": 0.43}}``; NaN is ``float("nan")``."""
    attempts = attempts_of(session, run_id) if attempts is None else attempts
    return metricstore.latest(session, run_id, lineage_cutoffs(attempts))


def attempts_of(session: Session, run_id: int) -> list[dict[str, Any]]:
    rows = session.execute(
        select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.number)
    ).scalars().all()
    attempts = [
        {
            "number": a.number,
            "status": a.status,
            "exit_code": a.exit_code,
            "reason": a.reason,
            "started_at": a.started_at,
            "first_step_at": a.first_step_at,
            "progress_at": a.progress_at,
            "phase": a.phase,
            "ended_at": a.ended_at,
            "last_step": a.last_step,
            "pid": a.pid,
            "port": a.port,
            "devices": json.loads(a.devices_json or "[]"),
            "resume_step": a.resume_step,
            "resume_dir": a.resume_dir,
            "resume_path": a.resume_path,
            "overrides": json.loads(a.overrides_json or "{}"),
            "cause": a.cause,
            "failed_rank": a.failed_rank,
            "exception": a.exception,
            "log_tail": a.log_tail,
            "last_checkpoint_step": a.last_checkpoint_step,
            "steps_lost": a.steps_lost,
            "failed_at": a.failed_at,
            "detected_at": a.detected_at,
            "detect_s": (a.detected_at - a.failed_at) if a.detected_at and a.failed_at else None,
            "retry_counted": a.retry_counted,
            "watching": a.watching,
            "dir": a.dir,
            "executor": a.executor or "local",
            "job_id": a.job_id,
            "job_state": a.job_state,
            "job_reason": a.job_reason,
            "job_nodes": a.job_nodes,
            "job_state_at": a.job_state_at,
            "phase_marks": marks_from_json(a.phase_marks_json),
        }
        for a in rows
    ]
    previous: dict[str, Any] | None = None
    for a in attempts:  # where each start-up went, and the recovery before it (db/vocabulary/phases.py)
        a["phases"] = attempt_phases(a, previous)
        previous = a
    return attempts


def events_of(session: Session, run_id: int, limit: int = 100) -> list[dict[str, Any]]:
    rows = session.execute(
        select(Event).where(Event.run_id == run_id).order_by(Event.id.desc()).limit(limit)
    ).scalars().all()
    return [
        {"at": e.at, "attempt": e.attempt, "level": e.level, "kind": e.kind, "message": e.message}
        for e in rows
    ]


def status_history(session: Session, run_id: int) -> list[dict[str, Any]]:
    rows = session.execute(
        select(RunStatusHistory).where(RunStatusHistory.run_id == run_id).order_by(RunStatusHistory.id)
    ).scalars().all()
    return [{"from": h.from_status, "to": h.to_status, "reason": h.reason, "at": h.at} for h in rows]


def run_detail(session: Session, run_id: int, now: float | None = None) -> dict[str, Any]:
    """Everything `runyard show --json` prints about a run; its running attempts, elapsed time,
    cost and goodput counted up to ``now`` (default: the clock, read once for all of them)."""
    now = time.time() if now is None else now
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(f"no run with id {run_id}; `runyard ls` lists the runs")
    (detail,) = _run_summaries(session, [run], now)
    detail["config"] = json.loads(run.config_json)
    detail["imported"] = imported(run)
    detail["run_dir"] = run.run_dir
    detail["attempts"] = attempts = attempts_of(session, run_id)
    _, energy = energies(session, {run_id: [a["number"] for a in attempts]})
    for a in attempts:
        a["energy"] = energy[(run_id, a["number"])]  # {"kwh", "method", "source"}: db/vocabulary/energy.py
    for a, b in pairwise(attempts):
        # The recovery: failure -> detected -> relaunched -> first new step.
        a["relaunched_at"] = b["started_at"]
        a["next_first_step_at"] = b["first_step_at"]
        a["recovery_s"] = recovery_s(b, a)  # the sum of b's phases (db/vocabulary/phases.py)
    detail["goodput"] = goodput(session, run, attempts, now)
    detail["goodput_parts"] = goodput_parts(session, run, attempts, now) if detail["goodput"] is not None else None
    pending = detail["step"] if run.resume_checkpoint_id is not None and run.status == RunStatus.QUEUED else None
    # A resume already asked for abandons what came after its step, as its attempt will.
    lineage = attempts + ([{"number": attempts[-1]["number"] + 1, "resume_step": pending}]
                          if attempts and pending is not None else [])
    detail["metrics"] = latest_metrics(session, run_id, lineage)
    detail["checkpoints"] = checkpoints_of(session, run_id)
    detail["history"] = status_history(session, run_id)
    detail["events"] = events_of(session, run_id)
    detail["rank_checks"] = rank_checks(session, run_id)
    return detail


def rank_checks(session: Session, run_id: int) -> dict[str, str | None] | None:
    """The newest attempt's ``checks`` event (db/vocabulary/checks.py): {check: None where it runs, else why
    not}; None before any rank reported through runyard (or never, for a plain script)."""
    message = session.execute(
        select(Event.message).where(Event.run_id == run_id, Event.kind == CHECKS_EVENT)
        .order_by(Event.id.desc()).limit(1)
    ).scalar()
    return parse_checks(message) if message is not None else None


def log_sources(session: Session, run_id: int) -> dict[str, Any]:
    """What ``runyard logs`` needs to find a run's log files, and no more (two small reads).

    Returns:
        ``status``; ``nproc_per_node``, the ranks per node of its config (0 when unset);
        ``attempts``: ``{"number", "dir"}`` of each attempt, oldest first.

    Raises:
        RunNotFound: when there is no such run.
    """
    row = session.execute(select(Run.status, Run.config_json).where(Run.id == run_id)).one_or_none()
    if row is None:
        raise RunNotFound(f"no run with id {run_id}; `runyard ls` lists the runs")
    launch = json.loads(row.config_json).get("launch", {})
    attempts = session.execute(
        select(Attempt.number, Attempt.dir).where(Attempt.run_id == run_id).order_by(Attempt.number)
    ).all()
    return {
        "status": row.status,
        "nproc_per_node": int(launch.get("nproc_per_node", 0) or 0),
        "world_size": int(launch.get("nproc_per_node", 0) or 0) * int(launch.get("nnodes", 1) or 1),
        "attempts": [{"number": number, "dir": folder} for number, folder in attempts],
    }


def run_status(session: Session, run_id: int) -> tuple[str, int | None]:
    """A run's status and its newest attempt's number (None before its first), in one statement:
    what ``runyard logs --follow`` reads every half second.

    Raises:
        RunNotFound: when there is no such run.
    """
    newest = select(func.max(Attempt.number)).where(Attempt.run_id == run_id).scalar_subquery()
    row = session.execute(select(Run.status, newest).where(Run.id == run_id)).one_or_none()
    if row is None:
        raise RunNotFound(f"no run with id {run_id}; `runyard ls` lists the runs")
    return row[0], row[1]



def checkpoints_of(session: Session, run_id: int) -> list[dict[str, Any]]:
    """The run's checkpoint history, oldest first, deleted ones included."""
    rows = session.execute(
        select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step, Checkpoint.id)
    ).scalars().all()
    return [
        {
            "id": c.id,
            "step": c.step,
            "attempt": c.attempt,
            "path": c.path,
            "bytes": c.bytes,
            "sha256": c.sha256,
            "params_digest": c.params_digest,
            "metrics": json.loads(c.metrics_json or "{}"),
            "blocked_s": c.blocked_s,
            "total_s": c.total_s,
            "created_at": c.created_at,
            "verified": bool(c.verified),
            "refused_reason": c.refused_reason,
            "pinned": bool(c.pinned),
            "deleted": bool(c.deleted),
            "deleted_reason": c.deleted_reason,
            "source": c.source,
            "origin": c.origin,
            "file_mtime": c.file_mtime,
        }
        for c in rows
    ]


def metric_keys(session: Session, run_id: int) -> list[str]:
    return metricstore.metric_keys(session, run_id)


def iter_metric_rows(session: Session, run_id: int, batch: int = 10_000) -> Iterator[tuple[Any, ...]]:
    """Every raw point of a run, in (attempt, step, rank, key) order, streamed in batches:
    (attempt, rank, step, key, value, time, superseded); NaN is ``float("nan")``."""
    cutoffs = lineage_cutoffs(attempts_of(session, run_id))
    for attempt, rank, step, key, value, wall in metricstore.iter_rows(session, run_id, batch):
        yield attempt, rank, step, key, value, wall, step > cutoffs.get(attempt, float("inf"))


def scheduler_status(session: Session, now: float | None = None, heartbeat_file: Path | None = None) -> dict[str, Any]:
    """The newest scheduler heartbeat, whether it is stale, and whether the scheduler can write
    the database.

    With ``heartbeat_file`` (``Settings.scheduler_file``) the scheduler's own file is read too: it
    is written in place when the database cannot be written, so a scheduler that is alive but
    whose database refuses writes is told apart from one that is offline (``db_error``).
    """
    now = time.time() if now is None else now
    hb = session.execute(
        select(SchedulerHeartbeat).order_by(SchedulerHeartbeat.beat_at.desc()).limit(1)
    ).scalar_one_or_none()
    status: dict[str, Any] = {"online": False, "age_s": None, "host": None, "pid": None, "db_error": None}
    if hb is not None:
        age = now - hb.beat_at
        status.update(online=age <= HEARTBEAT_STALE_S, age_s=age, host=hb.host, pid=hb.pid)
    record = read_scheduler_file(heartbeat_file) if heartbeat_file is not None else None
    if record is not None and now - float(record.get("written_at") or 0) <= HEARTBEAT_STALE_S:
        file_age = now - float(record["written_at"])
        status.update(online=True, host=record.get("host"), pid=record.get("pid"),
                      age_s=min(file_age, status["age_s"]) if status["age_s"] is not None else file_age,
                      db_error=record.get("db_error"), db_error_since=record.get("db_error_since"))
    return status


def price_table(session: Session) -> dict[str, float]:
    """The price table: the saved one, or the built-in defaults before anyone edited it."""
    rows = session.execute(select(PriceEntry.device, PriceEntry.usd_per_hour)).all()
    return {d: p for d, p in rows} if rows else default_prices()


def event_counts(session: Session, run_id: int) -> dict[str, int]:
    """How many events of each kind the run has (every one, not only the newest page)."""
    rows = session.execute(
        select(Event.kind, func.count()).where(Event.run_id == run_id).group_by(Event.kind)
    ).all()
    return {kind: int(n) for kind, n in rows}
