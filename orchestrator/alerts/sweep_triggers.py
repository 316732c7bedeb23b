"""What a sweep's end tells: ``sweep_finished`` (FINISHED: its best trial and value),
``sweep_breaker`` (STOPPED by its breaker: which error, how many times) and ``sweep_budget``
(STOPPED by its budget: which limit, spent against it).

Each is an edge in the sweep's status history (``sweep_status_history``), found for
:data:`~orchestrator.alerts.triggers.EDGE_WINDOW_S` after it as the run triggers' edges are, and
its alert key (``sweep:<id>:<trigger>``) makes it fire once: a sweep ends once. A sweep's alerts
follow its base config's ``[alerts]`` (on, off, enabled, channels), the section its trials' runs
follow too. The sentence of the stop is the one the sweeps job wrote (orchestrator/sweeps/budget.py);
:func:`db.sweeps.states.stopped_by` tells the breaker's from the budget's.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Alert, Sweep, SweepStatusHistory
from db.sweeps.queries import best_trial, trials_of
from db.sweeps.states import SweepStatus, stopped_by
from db.vocabulary.config import AlertsConfig
from orchestrator.alerts.findings import Finding, RunRules, duration, rules_for

# Each trigger's words in a message's title.
TITLES = {"sweep_finished": "finished", "sweep_breaker": "stopped by its breaker",
          "sweep_budget": "stopped by its budget"}
KEY_PREFIX = "sweep:"


def sweep_label(sweep: Sweep) -> str:
    return f"sweep {sweep.id} ({sweep.name})"


def sweep_of_key(key: str | None) -> int | None:
    """The sweep an alert key names (``sweep:<id>:<trigger>``), or None for any other key."""
    if not key or not key.startswith(KEY_PREFIX):
        return None
    number = key[len(KEY_PREFIX):].split(":", 1)[0]
    return int(number) if number.isdigit() else None


def sweep_alerts(sweep: Sweep) -> AlertsConfig:
    """The ``[alerts]`` of the sweep's base config (its trials' too); the defaults without one."""
    section = json.loads(sweep.base_json).get("alerts")
    return AlertsConfig.model_validate(section if isinstance(section, dict) else {})


def sweep_rules(sweep: Sweep, default_triggers: tuple[str, ...]) -> RunRules:
    return rules_for(sweep_alerts(sweep), default_triggers)


def trigger_of(to_status: str, reason: str | None) -> str | None:
    """The trigger of a sweep's move to ``to_status`` with ``reason``; None for one that tells nothing
    (a pause, a person's cancel)."""
    if to_status == SweepStatus.FINISHED.value:
        return "sweep_finished"
    if to_status == SweepStatus.STOPPED.value:
        by = stopped_by(reason)
        return f"sweep_{by}" if by else None
    return None


def _number(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _best_words(sweep: Sweep, section: dict[str, Any], trials: list[dict[str, Any]]) -> str:
    """The best trial as the sweep page names it, and how to take it forward."""
    metric, goal = section.get("metric", "?"), section.get("goal", "minimize")
    best = best_trial(trials, goal)
    if best is None:
        return f"no trial reported {metric}; `runyard sweep show {sweep.id}` lists the trials"
    params = ", ".join(f"{key}={value}" for key, value in best["params"].items())
    at = "at its end" if best["objective"] is not None else f"at rung {best['rung']}"
    return (f"best trial {best['number']} (run {best['run_id']}): {metric} {_number(best['value'])} {at} "
            f"({goal}) with {params or 'the base config'}; `runyard sweep best {sweep.id}` prints its config "
            "to submit or fork from")


def _counts(trials: list[dict[str, Any]]) -> str:
    by = Counter(t["status"] for t in trials)
    return f"{len(trials)} trial(s)" + (f" ({', '.join(f'{n} {s}' for s, n in sorted(by.items()))})" if by else "")


def _message(trigger: str, sweep: Sweep, reason: str, took: float, trials: list[dict[str, Any]]) -> str:
    section = json.loads(sweep.sweep_json)
    label, best = sweep_label(sweep), _best_words(sweep, section, trials)
    said = reason.removeprefix("stopped: ")
    if trigger == "sweep_finished":
        return f"{label} FINISHED after {duration(took)}: {_counts(trials)}; {best}"
    # The trials it stopped (each asked to stop with the sweep's sentence): they may still be saving.
    stopped = [t["number"] for t in trials if (t["prune"] or {}).get("why") == reason]
    what = (f"; trial(s) {', '.join(map(str, stopped))} were training: each stops at a checkpoint (PRUNED; "
            f"`runyard sweep promote {sweep.id} TRIAL` continues one)") if stopped else ""
    if trigger == "sweep_breaker":
        failed = [t for t in trials if t["status"] == "FAILED" and t["run_id"] is not None]
        logs = f"; `runyard logs {failed[-1]['run_id']}` shows a failing trial's log" if failed else ""
        return f"{label} STOPPED after {duration(took)}, {_counts(trials)}: {said}{logs}{what}"
    return (f"{label} STOPPED after {duration(took)}, {_counts(trials)}: {said}{what}; {best}; raise the limit "
            "in a new sweep's [sweep.budget] to go further")


def sweep_ends(session: Session, horizon: float, now: float, default_triggers: tuple[str, ...]) -> list[Finding]:
    """The sweeps that ended FINISHED or STOPPED (by the breaker or the budget) since ``horizon``,
    one finding each where the sweep's rules turn its trigger on."""
    out = []
    rows = session.execute(
        select(Sweep, SweepStatusHistory).join(SweepStatusHistory, SweepStatusHistory.sweep_id == Sweep.id)
        .where(SweepStatusHistory.to_status.in_([SweepStatus.FINISHED.value, SweepStatus.STOPPED.value]),
               SweepStatusHistory.at >= horizon)
        .order_by(SweepStatusHistory.id)).all()
    ends = [(sweep, row, trigger) for sweep, row in rows
            if (trigger := trigger_of(row.to_status, row.reason)) is not None]
    keys = [f"{KEY_PREFIX}{sweep.id}:{trigger}" for sweep, _, trigger in ends]
    # A sweep's trials are read for its message only until it was told (every pass for the edge
    # window otherwise: hundreds of trials each time).
    told = set(session.scalars(select(Alert.key).where(Alert.key.in_(keys)))) if keys else set()
    for (sweep, row, trigger), key in zip(ends, keys, strict=True):
        if key in told or trigger not in sweep_rules(sweep, default_triggers).triggers:
            continue
        trials = trials_of(session, sweep.id, now)
        message = _message(trigger, sweep, row.reason or "", row.at - sweep.created_at, trials)
        out.append(Finding(key=key, trigger=trigger, run_id=None, sweep_id=sweep.id, ongoing=False,
                           title=f"runyard: {sweep_label(sweep)} {TITLES[trigger]}", message=message))
    return out
