"""What the UI and the CLI show of sweeps, as plain data (dicts and lists, never ORM objects, so
that Streamlit can cache them): the sweeps list, one sweep with its trials and its rungs, what it
has spent and has left, and an ETA. Names the pages read (kept stable):

- :func:`sweep_list` -> one dict a sweep: ``id``, ``name``, ``status``, ``status_reason``,
  ``metric``, ``goal``, ``searcher``, ``created_at``, ``ended_at``, ``max_trials``,
  ``max_concurrent``, ``trial_count``, ``by_status`` (``{"RUNNING": 2, "PRUNED": 5}``), ``best``
  (a trial dict or None), ``spent``, ``budget``, ``left`` and ``eta_s``;
- :func:`sweep_detail` -> the same, plus ``seed``, ``space`` (the keys), ``rungs`` (the rungs'
  steps), ``reduction``, ``base`` (the base config as plain data), ``sweep`` (the ``[sweep]``
  section), ``trials`` (below, by number), ``rung_table`` and ``history``;
- a trial: ``number``, ``run_id``, ``run_name``, ``status`` (its run's; ``REFUSED`` when its config
  was refused and no run made, ``DELETED`` when its run was deleted), ``params``, ``rung`` (the
  newest rung judged, or None), ``rungs`` (``{k: {"step", "value"}}``), ``objective`` and
  ``objective_step`` (at its end), ``value`` and ``level`` (its best known: the objective, else
  its value at its deepest rung; ``level`` counts the rungs passed, the end one more), ``step``
  (its run's step), ``stopped_at`` (the step a PRUNED trial stopped at), ``promoted``, ``error``,
  ``prune`` (why it was stopped early), ``elapsed_s`` (its attempts' time), ``gpu_hours``,
  ``cost_usd``, ``created_at``;
- ``rung_table``: per rung, ``rung``, ``step``, ``values`` (every value recorded there),
  ``count`` and ``kept`` (``floor(count / reduction)``: how many go on);
- ``spent``/``budget``/``left``: ``gpu_hours``, ``usd``, ``wall_hours`` (``budget`` 0 and ``left``
  None where there is no limit).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Attempt, Run, Sweep, SweepStatusHistory, SweepTrial
from db.states import TERMINAL_VALUES
from db.sweeps.states import SWEEP_TERMINAL, SweepStatus
from db.vocabulary.cost import cost_usd

REFUSED, DELETED = "REFUSED", "DELETED"  # a trial without a run: its config refused, or its run deleted
# A trial's run that holds devices or is about to: what max_concurrent counts.
TRAINING = frozenset({"QUEUED", "STARTING", "RUNNING", "RETRYING", "PAUSING", "CANCELLING"})


def goal_score(value: float | None, goal: str) -> float:
    """``value`` on a scale where higher is better (itself to maximize, negated to minimize); a
    missing or NaN value is the worst of all."""
    if value is None or math.isnan(value):
        return -math.inf
    return value if goal == "maximize" else -value


def _spans(session: Session, run_ids: list[int]) -> dict[int, list[tuple[float, float | None, int]]]:
    """Per run, each attempt's (start, end or None, devices): a GPU attempt's GPUs, else its ranks."""
    spans: dict[int, list[tuple[float, float | None, int]]] = {run_id: [] for run_id in run_ids}
    if not run_ids:
        return spans
    for run_id, nproc, start, end, devices in session.execute(
            select(Attempt.run_id, Run.nproc, Attempt.started_at, Attempt.ended_at, Attempt.devices_json)
            .join(Run, Run.id == Attempt.run_id).where(Attempt.run_id.in_(run_ids))):
        spans[run_id].append((start, end, len(json.loads(devices or "[]")) or nproc))
    return spans


def _trial(row: SweepTrial, run: Any, spans: list[tuple[float, float | None, int]], now: float) -> dict[str, Any]:
    """One trial as the pages show it (``run``: its run's columns, or None)."""
    rungs = {int(k): {"step": step, "value": value} for k, (step, value) in json.loads(row.rungs_json).items()}
    done = row.objective_step is not None
    deepest = max((k for k, r in rungs.items()), default=None)
    status = run.status if run is not None else (REFUSED if row.error else DELETED)
    return {
        "number": row.number, "run_id": row.run_id, "run_name": run.name if run is not None else None,
        "status": status, "params": json.loads(row.params_json), "rung": row.rung, "rungs": rungs,
        "objective": row.objective if done else None, "objective_step": row.objective_step,
        "value": row.objective if done else (rungs[deepest]["value"] if deepest is not None else None),
        "level": len(rungs) + 1 if done else len(rungs),
        "step": run.step if run is not None else None,
        "stopped_at": run.step if status == "PRUNED" else None,
        "promoted": row.promoted, "error": row.error,
        "prune": json.loads(row.prune_json) if row.prune_json else None,
        "elapsed_s": sum((end or now) - start for start, end, _ in spans),
        "gpu_hours": sum(((end or now) - start) * devices for start, end, devices in spans) / 3600.0,
        "cost_usd": cost_usd([(start, end) for start, end, _ in spans], run.price if run is not None else 0.0, now),
        "created_at": row.created_at,
    }


def trials_of(session: Session, sweep_id: int, now: float | None = None) -> list[dict[str, Any]]:
    """The sweep's trials, by number, as :func:`sweep_detail` gives them (what the scheduler's
    sweep pass reads too)."""
    now = time.time() if now is None else now
    rows = session.scalars(select(SweepTrial).where(SweepTrial.sweep_id == sweep_id).order_by(SweepTrial.number)).all()
    run_ids = [r.run_id for r in rows if r.run_id is not None]
    runs: dict[int, Any] = {}
    if run_ids:
        newest = (select(Attempt.last_step).where(Attempt.run_id == Run.id).order_by(Attempt.number.desc())
                  .limit(1).scalar_subquery())
        runs = {r.id: r for r in session.execute(
            select(Run.id, Run.name, Run.status, Run.price_usd_per_hour.label("price"), newest.label("step"))
            .where(Run.id.in_(run_ids)))}
    spans = _spans(session, run_ids)
    return [_trial(r, runs.get(r.run_id) if r.run_id is not None else None,
                   spans.get(r.run_id, []) if r.run_id is not None else [], now) for r in rows]


def best_trial(trials: list[dict[str, Any]], goal: str) -> dict[str, Any] | None:
    """The best trial: the deepest trained (a finished one first, then by the rungs it passed),
    then the best value there; None before any value."""
    ranked = [t for t in trials if t["value"] is not None and not math.isnan(t["value"])]
    return max(ranked, key=lambda t: (t["level"], goal_score(t["value"], goal), -t["number"]), default=None)


def spent(trials: list[dict[str, Any]], sweep: Sweep, now: float) -> dict[str, float]:
    """What the sweep has spent: its trials' device-hours and dollars, and its wall time."""
    return {"gpu_hours": sum(t["gpu_hours"] for t in trials), "usd": sum(t["cost_usd"] for t in trials),
            "wall_hours": ((sweep.ended_at or now) - sweep.created_at) / 3600.0}


def eta_s(trials: list[dict[str, Any]], sweep: Sweep) -> float | None:
    """A rough time until the sweep ends: the trials still to start each taking the mean time of
    the trials that ended, those training what is left of it, ``max_concurrent`` at a time; 0 once
    the sweep ended, None before a trial has ended."""
    if SweepStatus(sweep.status) in SWEEP_TERMINAL:
        return 0.0
    ended: list[float] = [t["elapsed_s"] for t in trials
                          if t["status"] in TERMINAL_VALUES and t["elapsed_s"] > 0]
    if not ended:
        return None
    mean_s = sum(ended) / len(ended)
    left = max(0, sweep.max_trials - len(trials)) * mean_s
    left += sum(max(0.0, mean_s - float(t["elapsed_s"])) for t in trials if t["status"] in TRAINING)
    return left / max(1, sweep.max_concurrent)


def _summary(sweep: Sweep, trials: list[dict[str, Any]], now: float) -> dict[str, Any]:
    section = json.loads(sweep.sweep_json)
    budget = {key: float(section.get("budget", {}).get(key, 0.0)) for key in ("gpu_hours", "usd", "wall_hours")}
    used = spent(trials, sweep, now)
    by_status: dict[str, int] = {}
    for t in trials:
        by_status[t["status"]] = by_status.get(t["status"], 0) + 1
    return {
        "id": sweep.id, "name": sweep.name, "status": sweep.status, "status_reason": sweep.status_reason,
        "metric": section.get("metric"), "goal": section.get("goal"), "searcher": section.get("searcher"),
        "created_at": sweep.created_at, "ended_at": sweep.ended_at, "max_trials": sweep.max_trials,
        "max_concurrent": sweep.max_concurrent, "trial_count": len(trials), "by_status": by_status,
        "best": best_trial(trials, section.get("goal", "minimize")), "spent": used, "budget": budget,
        "left": {key: (budget[key] - used[key] if budget[key] else None) for key in budget},
        "eta_s": eta_s(trials, sweep),
    }


def sweep_list(session: Session, now: float | None = None) -> list[dict[str, Any]]:
    """Every sweep, newest first, as the Sweeps page and `runyard sweep ls` show it."""
    now = time.time() if now is None else now
    sweeps = session.scalars(select(Sweep).order_by(Sweep.id.desc())).all()
    return [_summary(s, trials_of(session, s.id, now), now) for s in sweeps]


def sweep_detail(session: Session, sweep_id: int, now: float | None = None) -> dict[str, Any] | None:
    """One sweep with its trials, rungs and history, as the sweep page and `runyard sweep show`
    show it; None when there is no such sweep."""
    now = time.time() if now is None else now
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        return None
    trials = trials_of(session, sweep_id, now)
    section = json.loads(sweep.sweep_json)
    reduction = int((section.get("early_stop") or {}).get("reduction") or 0)
    rungs = json.loads(sweep.rungs_json)
    table = []
    for k, step in enumerate(rungs):
        values = [t["rungs"][k]["value"] for t in trials if k in t["rungs"]]
        table.append({"rung": k, "step": step, "values": values, "count": len(values),
                      "kept": len(values) // reduction if reduction else len(values)})
    history = [{"from": h.from_status, "to": h.to_status, "reason": h.reason, "at": h.at} for h in session.scalars(
        select(SweepStatusHistory).where(SweepStatusHistory.sweep_id == sweep_id).order_by(SweepStatusHistory.id))]
    return {**_summary(sweep, trials, now), "seed": sweep.seed, "space": list(section.get("space", {})),
            "rungs": rungs, "reduction": reduction or None, "base": json.loads(sweep.base_json), "sweep": section,
            "trials": trials, "rung_table": table, "history": history}
