"""Read queries for the UI and the CLI. They return plain data (dicts, lists, DataFrames),
never ORM objects, so that Streamlit can cache them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from sqlalchemy import Row, func, or_, select
from sqlalchemy.orm import Session
from typing_extensions import Unpack

from db import metricstore
from db.models import Attempt, Checkpoint, Event, PriceEntry, Run, RunStatusHistory, SchedulerHeartbeat
from db.requests import RunNotFound, imported
from db.states import TERMINAL, RunStatus
from db.vocabulary.causes import INTERRUPTIONS, Cause
from db.vocabulary.checks import CHECKS_EVENT, parse_checks
from db.vocabulary.cost import (
    ETA_WINDOW,
    AttemptSpan,
    Eta,
    cost_usd,
    default_prices,
    eta_estimate,
    wasted_seconds,
    young_daly_interval_s,
)
from db.vocabulary.phases import attempt_phases, marks_from_json, recovery_s
from db.vocabulary.scheduler_file import read_scheduler_file

HEARTBEAT_STALE_S = 10.0
INT64_MAX = 2**63 - 1


def resolve_run(session: Session, ref: str | int) -> int:
    """A run id from an id (``12``, ``#12``) or a name (the newest run with that name)."""
    text = str(ref).lstrip("#")
    if text.isascii() and text.isdigit():  # "²".isdigit() is true, int("²") is an error
        # Ids are 64-bit; a larger number is no run (and would overflow the query's parameter).
        if int(text) > INT64_MAX or session.get(Run, int(text)) is None:
            raise RunNotFound(f"no run with id {text}; `runyard ls` lists the runs")
        return int(text)
    run_id = session.scalar(select(Run.id).where(Run.name == text).order_by(Run.id.desc()))
    if run_id is None:
        raise RunNotFound(f"no run named {text!r}; `runyard ls` lists the runs")
    return run_id


# The run and attempt columns a summary reads: not the config, log tails or exceptions, which
# a list of 200 runs would otherwise carry from the database for nothing.
_RUN_COLUMNS = (
    Run.id, Run.name, Run.status, Run.status_reason, Run.tags_json, Run.max_steps, Run.nproc, Run.created_at,
    Run.started_at, Run.ended_at, Run.price_usd_per_hour, Run.price_unit, Run.parent_run_id, Run.parent_step,
    Run.resume_checkpoint_id, Run.retries_used, Run.retry_at, Run.executor, Run.starred, Run.archived, Run.note,
)
_ATTEMPT_COLUMNS = (
    Attempt.run_id, Attempt.number, Attempt.started_at, Attempt.ended_at, Attempt.first_step_at, Attempt.last_step,
    Attempt.resume_step, Attempt.cause, Attempt.job_id, Attempt.job_state,
)
ETA_POINTS = ETA_WINDOW  # rank 0's newest points of its progress metric the ETA is projected from

# A row of any columns (typing.Unpack is Python 3.11+; typing_extensions comes with pydantic); a run
# as _run_summary reads it: an ORM Run, or a row of _RUN_COLUMNS.
AnyRow = Row[Unpack[tuple[Any, ...]]]
RunLike = Run | AnyRow


def _run_summaries(session: Session, runs: Sequence[RunLike], now: float) -> list[dict[str, Any]]:
    """The summary of each run (what ``runyard ls`` and the Runs page show), read in the same
    few statements however many runs there are: every attempt of the runs at once, their
    newest checkpoint time per attempt at once, and the live runs' newest loss points at once.

    Args:
        session: Where to read.
        runs: The runs, as ORM objects or rows of ``_RUN_COLUMNS``.
        now: The time that running attempts, elapsed time and cost are counted up to.

    Returns:
        One dict per run, in the order of ``runs``.
    """
    ids = [r.id for r in runs]
    attempts: dict[int, list[AnyRow]] = {run_id: [] for run_id in ids}
    if ids:
        for a in session.execute(
            select(*_ATTEMPT_COLUMNS).where(Attempt.run_id.in_(ids)).order_by(Attempt.run_id, Attempt.number)
        ):
            attempts[a.run_id].append(a)
    written: dict[tuple[int, int], float] = {}
    if with_attempts := [run_id for run_id in ids if attempts[run_id]]:
        rows = session.execute(
            select(Checkpoint.run_id, Checkpoint.attempt, func.max(Checkpoint.created_at))
            .where(Checkpoint.run_id.in_(with_attempts))
            .group_by(Checkpoint.run_id, Checkpoint.attempt)
        )
        written = {(run_id, attempt): at for run_id, attempt, at in rows}
    # Only a run that is still going has an ETA to project, from its newest attempt's rank 0 (the
    # steps of its loss, or of whatever metric it reports: metricstore.progress_key); a run queued
    # to resume has none until its new attempt trains (its old pace ended elsewhere).
    live = [(r.id, attempts[r.id][-1].number, 0) for r in runs
            if attempts[r.id] and RunStatus(r.status) not in TERMINAL and RunStatus(r.status) is not RunStatus.QUEUED]
    points = metricstore.recent_progress(session, live, limit=ETA_POINTS)
    # A run queued to resume from a checkpoint is at that checkpoint's step, not where it stopped.
    resumes = {r.resume_checkpoint_id for r in runs if r.resume_checkpoint_id is not None}
    resume_steps: dict[int, int] = dict(session.execute(
        select(Checkpoint.id, Checkpoint.step).where(Checkpoint.id.in_(resumes))).all()) if resumes else {}
    return [
        _run_summary(r, attempts[r.id], written,
                     points.get((r.id, attempts[r.id][-1].number, 0), []) if attempts[r.id] else [], now,
                     resume_steps.get(r.resume_checkpoint_id) if r.resume_checkpoint_id is not None else None)
        for r in runs
    ]


def lineage_step(status: RunStatus, attempts: Sequence[Any], resume_step: int | None,
                 parent_step: int | None) -> int:
    """The step a run is at on its lineage: the step its pending resume starts from (a run queued
    to resume from step 5000 is at 5000, not at the 10000 it had reached); else its newest
    attempt's (an older one may have got further before the run was resumed from an earlier
    checkpoint); else, for a fork that has not started, its parent's step; else 0."""
    if status is RunStatus.QUEUED and resume_step is not None:
        return resume_step
    if attempts:
        return attempts[-1].last_step or attempts[-1].resume_step or 0
    return parent_step or 0


def elapsed_s(run: RunLike, attempts: Sequence[Any], now: float) -> float | None:
    """How long the run has been at work: its attempts' time (launch to end, or to ``now``) plus
    the waits before retries (the backoff after a failure, the current one included), never the
    time it sat paused, cancelled or finished before a person resumed it. None before it started."""
    if not attempts:
        return ((run.ended_at or now) - run.started_at) if run.started_at else None
    held: float = sum((a.ended_at or now) - a.started_at for a in attempts)
    waits: float = sum(b.started_at - (a.ended_at or b.started_at) for a, b in pairwise(attempts) if a.cause)
    last = attempts[-1]
    if RunStatus(run.status) is RunStatus.RETRYING and last.ended_at is not None:
        waits += max(0.0, now - last.ended_at)
    return held + waits


def _run_summary(run: RunLike, attempts: list[AnyRow], written: dict[tuple[int, int], float],
                 recent_loss: list[tuple[int, float, float]], now: float,
                 resume_step: int | None = None) -> dict[str, Any]:
    """One run's summary from what :func:`_run_summaries` read: its attempts (oldest first), the
    newest checkpoint time per (run, attempt), rank 0's newest loss points of its newest attempt
    (newest first), and the step of the checkpoint a pending resume starts from."""
    status = RunStatus(run.status)
    step = lineage_step(status, attempts, resume_step, run.parent_step)
    if status is RunStatus.SUCCEEDED and run.max_steps and abs(step - run.max_steps) == 1:
        # Done, by a script that numbers its steps from 0 (Lightning's WandbLogger: last step 2999 of
        # 3000) or runs its loop to max_steps inclusive (nanoGPT's 1501 of 1500): shown as complete.
        step = run.max_steps
    eta: float | None
    estimate: Eta | None = None
    if status is RunStatus.SUCCEEDED:
        eta = 0.0
    elif status in TERMINAL or status is RunStatus.QUEUED or not attempts or not run.max_steps:
        eta = None
    else:
        estimate = eta_estimate([(int(s), float(t)) for s, _, t in recent_loss], run.max_steps)
        eta = estimate.seconds if estimate is not None else None
    spans = [(a.started_at, a.ended_at) for a in attempts]
    cost = cost_usd(spans, run.price_usd_per_hour, now)
    wasted = wasted_seconds(_attempt_spans(attempts, written), now) * run.price_usd_per_hour / 3600.0
    projected = cost + (eta or 0.0) * run.price_usd_per_hour / 3600.0 if status not in TERMINAL else cost
    return {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "status_reason": run.status_reason,
        "tags": json.loads(run.tags_json or "[]"),
        "step": step,
        "max_steps": run.max_steps,
        "progress": min(1.0, step / run.max_steps) if run.max_steps else 0.0,
        "nproc": run.nproc,
        "executor": run.executor or "local",
        "job_id": attempts[-1].job_id if attempts else None,
        "job_state": attempts[-1].job_state if attempts else None,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "elapsed_s": elapsed_s(run, attempts, now),
        "attempt_count": len(attempts),
        "cost_usd": round(cost, 6),
        "cost_wasted_usd": round(wasted, 6),
        "cost_projected_usd": round(projected, 6),
        "price_usd_per_hour": run.price_usd_per_hour,
        "price_unit": run.price_unit,
        "eta_s": eta,
        "eta_range_s": (estimate.low, estimate.high) if estimate is not None else None,
        "parent_run_id": run.parent_run_id,
        "parent_step": run.parent_step,
        "resume_checkpoint_id": run.resume_checkpoint_id,
        "retries_used": run.retries_used,
        "retry_at": run.retry_at,
        "starred": bool(run.starred),
        "archived": bool(run.archived),
        "note": run.note,
    }


def _attempt_spans(attempts: list[AnyRow], written: dict[tuple[int, int], float]) -> list[AttemptSpan]:
    """The cost arithmetic's view of one run's attempts (oldest first), with ``written`` the
    newest checkpoint time per (run, attempt)."""
    spans = []
    for i, a in enumerate(attempts):
        spans.append(AttemptSpan(
            started_at=a.started_at, ended_at=a.ended_at, first_step_at=a.first_step_at,
            failed=a.cause is not None and a.cause != Cause.PREEMPTED,
            last_checkpoint_at=written.get((a.run_id, a.number)),
            after_failure=i > 0 and attempts[i - 1].cause is not None,
        ))
    return spans


RUN_COLUMNS = _RUN_COLUMNS  # what run_summaries reads of a run (db/compare.py selects them with more)


def run_summaries(session: Session, runs: Sequence[RunLike], now: float) -> list[dict[str, Any]]:
    """The summary of each of ``runs`` (rows of ``RUN_COLUMNS``) as :func:`list_runs` gives it,
    in a fixed number of statements (see :func:`_run_summaries`)."""
    return _run_summaries(session, runs, now)


# What the Runs list and `runyard ls --sort` order by: a name -> the summary field it reads.
LIST_SORTS: dict[str, str] = {
    "id": "id", "name": "name", "status": "status", "created": "created_at", "step": "step",
    "progress": "progress", "elapsed": "elapsed_s", "cost": "cost_usd", "projected": "cost_projected_usd",
    "attempts": "attempt_count", "best_loss": "best_loss", "headline": "headline_value", "starred": "starred",
}
@dataclass(frozen=True)
class RunFilter:
    """Which runs a list shows.

    Attributes:
        statuses: Only these statuses (all when empty).
        search: Words that must all match (case-insensitive): each a part of the run's name, one
            of its tags, its note or a config value; ``key=value`` matches a config value exactly
            (``train.lr=0.001``, or the last part of the key alone: ``lr=0.001``).
        tags: Only runs with at least one of these tags (all when empty).
        starred: Only starred runs.
        archived: Show archived runs too (hidden otherwise).
    """

    statuses: tuple[str, ...] = ()
    search: str = ""
    tags: tuple[str, ...] = ()
    starred: bool = False
    archived: bool = False


def _like(text: str) -> str:
    """``text`` as a LIKE pattern that matches it anywhere, its wildcards escaped."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _search_terms(search: str) -> list[tuple[str | None, str]]:
    """The search words as (config key or None, text), lower case."""
    terms: list[tuple[str | None, str]] = []
    for word in search.split():
        key, eq, value = word.partition("=")
        terms.append((key.lower(), value.lower()) if eq and key and value else (None, word.lower()))
    return terms


def _matches(row: AnyRow, terms: list[tuple[str | None, str]]) -> bool:
    """Whether the run ``row`` (with its config_json) matches every search term."""
    config = {k.lower(): v for k, v in flatten(json.loads(row.config_json)).items()}
    values = [str(v).lower() for v in config.values()]
    tags = [str(t).lower() for t in json.loads(row.tags_json or "[]")]
    for key, text in terms:
        if key is not None:
            found = [v for k, v in config.items() if k == key or k.endswith("." + key)]
            if not any(_equal(v, text) for v in found):
                return False
        elif not (text in row.name.lower() or any(text in t for t in tags) or text in (row.note or "").lower()
                  or any(text in v for v in values)):
            return False
    return True


def _equal(value: Any, text: str) -> bool:
    """A config value equals a search's text: as text, or as a number (``1e-3`` = ``0.001``), or
    one element of a list."""
    if isinstance(value, list):
        return any(_equal(v, text) for v in value)
    if str(value).lower() == text:
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return False


def sort_runs(runs: list[dict[str, Any]], sort: str, descending: bool) -> list[dict[str, Any]]:
    """``runs`` (summaries) ordered by ``LIST_SORTS[sort]``, those without a value last either
    way, ties newest first.

    Raises:
        ValueError: ``sort`` is not a key of :data:`LIST_SORTS` (the message lists them).
    """
    if sort not in LIST_SORTS:
        raise ValueError(f"sort {sort!r}: use one of {', '.join(LIST_SORTS)}")
    field = LIST_SORTS[sort]
    with_value = [r for r in runs if r.get(field) is not None and r.get(field) == r.get(field)]  # NaN: no value
    without = [r for r in runs if r not in with_value]

    def key(r: dict[str, Any]) -> Any:
        value = r[field]
        return value.lower() if isinstance(value, str) else value

    ordered = sorted(sorted(with_value, key=lambda r: -r["id"]), key=key, reverse=descending)
    return ordered + without


def list_runs(session: Session, statuses: list[str] | None = None, limit: int = 200,
              now: float | None = None, *, where: RunFilter | None = None, sort: str = "id",
              descending: bool = True) -> list[dict[str, Any]]:
    """The newest matching runs, ordered as asked (db.compare.runs_list adds the summary metric
    columns, and sorts by them too).

    Reads a fixed number of statements whatever the number of runs (see :func:`_run_summaries`):
    the Runs page calls this every two seconds per open tab.

    Args:
        session: Where to read.
        statuses: Only runs in these statuses (all when None or empty); added to ``where``'s.
        limit: The most runs: the newest ``limit`` that match, then sorted.
        now: The time running attempts are counted up to (default: the wall clock).
        where: Which runs (:class:`RunFilter`; default: every run not archived).
        sort: A key of :data:`LIST_SORTS` (``best_loss`` and ``headline`` need db.compare.runs_list).
        descending: Largest first (newest first for ``id``).

    Raises:
        ValueError: ``sort`` is not a key of :data:`LIST_SORTS` (the message lists them).
    """
    where = where or RunFilter()
    wanted = [*where.statuses, *(statuses or [])]
    terms = _search_terms(where.search)
    columns = (*_RUN_COLUMNS, Run.config_json) if terms else _RUN_COLUMNS
    q = select(*columns).order_by(Run.id.desc())
    if wanted:
        q = q.where(Run.status.in_(wanted))
    if not where.archived:
        q = q.where(Run.archived.is_(False))
    if where.starred:
        q = q.where(Run.starred.is_(True))
    if where.tags:
        q = q.where(or_(*(Run.tags_json.like(_like(json.dumps(t)), escape="\\") for t in where.tags)))
    for key, text in terms:  # narrowed in SQL; exactly (values only, not keys) below
        pattern = _like(text if key is None else json.dumps(key.rsplit(".", 1)[-1]) + ":")  # a key as JSON spells it
        q = q.where(Run.config_json.ilike(pattern, escape="\\") if key is not None else or_(
            Run.name.ilike(pattern, escape="\\"), Run.tags_json.ilike(pattern, escape="\\"),
            Run.note.ilike(pattern, escape="\\"), Run.config_json.ilike(pattern, escape="\\")))
    rows: Sequence[AnyRow]
    if terms or where.tags:
        rows = [r for r in session.execute(q).all()
                if (not terms or _matches(r, terms))
                and (not where.tags or set(where.tags) & set(json.loads(r.tags_json or "[]")))][:limit]
    else:
        rows = session.execute(q.limit(limit)).all()
    now = time.time() if now is None else now
    summaries = _run_summaries(session, rows, now)
    return summaries if sort == "id" and descending else sort_runs(summaries, sort, descending)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"section.key": value}``; a value that is not a dict (a list, an
    empty dict) is kept whole."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def run_tags(session: Session) -> list[str]:
    """Every tag some run has, sorted (the Runs list's tag filter)."""
    tags: set[str] = set()
    for (text,) in session.execute(select(Run.tags_json).distinct()):
        tags.update(json.loads(text or "[]"))
    return sorted(tags)


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


def goodput(session: Session, run: Run, attempts: list[dict[str, Any]], now: float | None = None) -> float | None:
    """Productive step time over wall time: the steps on the run's lineage times the mean step
    time, divided by the time the run held its devices or waited to retry (failures, restarts,
    backoff and lost steps all lower it; a pause chosen by the person does not)."""
    if not attempts:
        return None
    now = time.time() if now is None else now
    cutoffs = lineage_cutoffs(attempts)
    total, count = 0.0, 0
    for a in attempts:  # rank 0's step times along the lineage, from the rollups
        s, n = metricstore.totals(session, run.id, "step_time", attempt=a["number"], rank=0,
                                  max_step=cutoffs.get(a["number"]))
        total, count = total + s, count + n
    last = attempts[-1]
    steps: int = last["last_step"] or last["resume_step"] or 0
    wall: float = sum((a["ended_at"] or now) - a["started_at"] for a in attempts)
    wall += sum(b["started_at"] - (a["ended_at"] or b["started_at"]) for a, b in pairwise(attempts) if a["cause"])
    if not count or wall <= 0:
        return None
    return min(1.0, steps * (total / count) / wall)


def goodput_parts(session: Session, run: Run, attempts: list[dict[str, Any]],
                  now: float | None = None) -> dict[str, float]:
    """Where the run's time went besides its productive steps, as shares of the same wall time
    :func:`goodput` divides by: ``startup`` (launch to first step of each attempt that did not
    follow a failure: imports, rendezvous, data loading, compilation), ``checkpoints`` (the time
    the training loop was blocked by saves), ``failures`` (each recovery's phases, db/vocabulary/phases.py:
    from the failure through teardown, detection, relaunch and the next attempt's start-up to its
    first step; and the steps lost since the last checkpoint) and ``other`` (evaluation, logging,
    slow steps: the rest)."""
    now = time.time() if now is None else now
    wall = sum((a["ended_at"] or now) - a["started_at"] for a in attempts)
    wall += sum(b["started_at"] - (a["ended_at"] or b["started_at"]) for a, b in pairwise(attempts) if a["cause"])
    if wall <= 0:
        return {}
    startup, failures = 0.0, 0.0
    previous: dict[str, Any] | None = None
    for a in attempts:
        ready = a["first_step_at"] or a["ended_at"] or now
        if previous is not None and previous["cause"]:
            # The recovery's phases: the failure (or, without its mark, the exit) to this first step.
            failures += ready - min(previous["failed_at"] or previous["ended_at"] or a["started_at"], a["started_at"])
        else:
            startup += ready - a["started_at"]
        previous = a
    blocked = float(session.scalar(select(func.coalesce(func.sum(Checkpoint.blocked_s), 0.0))
                                   .where(Checkpoint.run_id == run.id)) or 0.0)
    for a in attempts:
        if a["cause"] and a["first_step_at"] is not None:
            until = a["failed_at"] or a["ended_at"]
            if until is not None:  # the steps lost since the last checkpoint, at this attempt's pace
                failures += max(0.0, until - a["first_step_at"]) * (
                    (a["steps_lost"] or 0) / max(1, (a["last_step"] or 0) - (a["resume_step"] or 0)))
    productive = (goodput(session, run, attempts, now) or 0.0) * wall
    parts = {"startup": startup, "checkpoints": blocked, "failures": failures}
    parts["other"] = max(0.0, wall - productive - sum(parts.values()))
    return {key: min(1.0, value / wall) for key, value in parts.items()}


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


def lineage_cutoffs(attempts: list[dict[str, Any]]) -> dict[int, float]:
    """For each attempt, the last step that is still part of the run's lineage.

    When attempt b starts from step r (a checkpoint, or 0 from scratch), what earlier attempts
    did after step r was abandoned: it is shown as superseded, not mixed into the curves.
    """
    cutoffs: dict[int, float] = {}
    later_min = float("inf")
    for a in sorted(attempts, key=lambda a: a["number"], reverse=True):
        cutoffs[a["number"]] = later_min
        later_min = min(later_min, a["resume_step"] or 0)
    return cutoffs


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


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def checkpoint_advice(session: Session, run_id: int, now: float | None = None, recent: int = 10) -> dict[str, Any]:
    """The checkpoint interval Young–Daly recommends for this run, beside the configured one.

    - save cost C: the median time the training loop was blocked by the run's ``recent`` newest
      saves (``Checkpoint.blocked_s``; the rest of a save runs in the background);
    - MTBF M: device time of every attempt of every run on this machine over the number of
      attempts that ended by an interruption (``db.vocabulary.causes.INTERRUPTIONS``; cancels
      and pauses have no cause); None before the first one;
    - step time: wall seconds per step of the run's newest attempt that made progress (its
      first to its last reported step), so evaluation and saves are counted as the interval is.

    Returns:
        ``interval_s`` and ``interval_steps`` (None when something is missing, and ``missing``
        then says what, one sentence each), ``checkpoint_cost_s``, ``save_total_s``,
        ``mtbf_s``, ``failures``, ``device_time_s``, ``step_time_s``, and the configured
        ``every_steps`` / ``every_seconds``.
    """
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(f"no run with id {run_id}; `runyard ls` lists the runs")
    now = time.time() if now is None else now
    configured = json.loads(run.config_json).get("checkpoint", {})
    saves = session.execute(
        select(Checkpoint.blocked_s, Checkpoint.total_s).where(Checkpoint.run_id == run_id)
        .order_by(Checkpoint.created_at.desc()).limit(recent)
    ).all()
    cost = _median([b for b, _ in saves if b is not None])
    total = _median([t for _, t in saves if t is not None])

    spans = session.execute(select(Attempt.started_at, Attempt.ended_at, Attempt.cause)).all()
    device_time = sum(max(0.0, (end if end is not None else now) - start) for start, end, _ in spans)
    failures = sum(1 for _, _, cause in spans if cause in INTERRUPTIONS)
    mtbf = device_time / failures if failures else None

    step_time = None
    attempts = session.execute(
        select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.number.desc())
    ).scalars().all()
    for a in attempts:
        steps = (a.last_step or 0) - (a.resume_step or 0) - 1  # first_step_at is the first step's end
        if a.first_step_at is not None and a.progress_at is not None and steps > 0 and a.progress_at > a.first_step_at:
            step_time = (a.progress_at - a.first_step_at) / steps
            break

    missing = []
    if cost is None:
        missing.append("no checkpoint written yet, so the save cost is unknown")
    if mtbf is None:
        missing.append(f"no interruption seen on this machine yet ({device_time / 3600:.1f} h of attempts), "
                       "so the mean time between failures is unknown")
    if step_time is None:
        missing.append("not enough steps yet to measure the step time")
    interval_s = young_daly_interval_s(cost, mtbf) if cost is not None and mtbf is not None else None
    interval_steps = max(1, round(interval_s / step_time)) if interval_s is not None and step_time else None
    return {
        "interval_s": interval_s,
        "interval_steps": interval_steps,
        "checkpoint_cost_s": cost,
        "save_total_s": total,
        "mtbf_s": mtbf,
        "failures": failures,
        "device_time_s": device_time,
        "step_time_s": step_time,
        "every_steps": configured.get("every_steps"),
        "every_seconds": configured.get("every_seconds"),
        "missing": missing,
    }
