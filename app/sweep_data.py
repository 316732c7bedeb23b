"""The Sweeps pages' access to the database (app/data.py's engine and caches): the sweeps list and
one sweep as plain data (db/sweeps/queries.py), its parameter importance (cached on the trials'
values: a rerun with the same values does not fit the forest again), the trials' curves of the
sweep's metric (bounded: a few thousand points over every trial), and the requests a person makes
(pause, resume, cancel, new limits, promote: db/sweeps/requests.py, as `runyard sweep` makes them),
each returning the sentence to show.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import streamlit as st
from sqlalchemy.orm import Session

from app import data
from app.charts.sweep import curve_rows
from db.requests import RequestRefused
from db.sweeps import queries
from db.sweeps.requests import SweepNotFound, cancel_sweep, edit_sweep, pause_sweep, promote, resume_sweep, trial_of
from db.vocabulary.config.sweep import SweepConfig
from orchestrator.format import duration, usd
from orchestrator.sweeps import importance as forest

CURVE_POINTS = 4000  # every trial's curve together, at most (Altair's own limit is 5000 rows)
MIN_CURVE_POINTS = 8  # a trial's curve, at least


@st.cache_data(ttl=2.0, show_spinner=False)
def sweeps() -> list[dict[str, Any]]:
    """Every sweep, newest first (db.sweeps.queries.sweep_list)."""
    with data.sessions()() as s:
        return queries.sweep_list(s)


@st.cache_data(ttl=2.0, show_spinner=False)
def sweep(sweep_id: int) -> dict[str, Any] | None:
    """One sweep with its trials (db.sweeps.queries.sweep_detail); None when there is none."""
    with data.sessions()() as s:
        return queries.sweep_detail(s, sweep_id)


@st.cache_data(max_entries=32, show_spinner=False)
def _importance(section_json: str, values: tuple[tuple[str, float | None], ...]) -> dict[str, float]:
    section = SweepConfig.model_validate_json(section_json)
    return forest.importance(section, [{"params": json.loads(p), "value": v} for p, v in values])


def importance(d: dict[str, Any]) -> dict[str, float]:
    """Each key's share of the importance (orchestrator/sweeps/importance.py), fitted once per
    set of trials' values: the cache's key is the values themselves."""
    values = tuple((json.dumps(t["params"], sort_keys=True), t["value"]) for t in d["trials"])
    return _importance(json.dumps(d["sweep"], sort_keys=True), values)


def points_per_trial(trials: int) -> int:
    """How many buckets of each trial's curve to read: :data:`CURVE_POINTS` shared out."""
    return max(MIN_CURVE_POINTS, CURVE_POINTS // max(1, trials))


@st.cache_data(ttl=5.0, show_spinner=False)
def trial_curves(run_ids: tuple[tuple[int, int], ...], metric: str, ranks: str) -> dict[int, list[tuple[int, float]]]:
    """Each trial's curve of ``metric`` (trial number -> [(step, value)]) from the metric store at
    the level that keeps it under :func:`points_per_trial` buckets: ``run_ids`` holds (trial
    number, run id) pairs."""
    per_trial = points_per_trial(len(run_ids))
    out: dict[int, list[tuple[int, float]]] = {}
    for number, run_id in run_ids:
        rows = data.metric_series(run_id, metric, per_trial).rows
        out[number] = thinned(curve_rows(rows, ranks), per_trial)
    return out


def thinned(points: list[tuple[int, float]], most: int) -> list[tuple[int, float]]:
    """At most ``most`` of ``points``, evenly spread, the last kept (a resumed trial's attempts
    each bring up to ``most`` buckets)."""
    if len(points) <= most:
        return points
    every = len(points) / most
    return [points[min(len(points) - 1, round((i + 1) * every) - 1)] for i in range(most)]


def _changed() -> None:
    sweeps.clear()
    sweep.clear()
    data.run_detail.clear()
    data.list_runs.clear()


def _request(act: Callable[[Session], str]) -> tuple[bool, str]:
    """Make a request and commit it: (done, the sentence: what it did, or why it was refused)."""
    with data.sessions()() as s:
        try:
            said = act(s)
        except (RequestRefused, SweepNotFound) as exc:
            return False, str(exc)
        s.commit()
    _changed()
    return True, said


def pause(sweep_id: int) -> tuple[bool, str]:
    return _request(lambda s: pause_sweep(s, sweep_id, who="ui"))


def resume(sweep_id: int) -> tuple[bool, str]:
    return _request(lambda s: resume_sweep(s, sweep_id, who="ui"))


def cancel(sweep_id: int) -> tuple[bool, str]:
    return _request(lambda s: cancel_sweep(s, sweep_id, who="ui"))


def edit(sweep_id: int, max_trials: int | None, max_concurrent: int | None) -> tuple[bool, str]:
    return _request(lambda s: edit_sweep(s, sweep_id, max_trials=max_trials, max_concurrent=max_concurrent, who="ui"))


def promote_trial(sweep_id: int, number: int) -> tuple[bool, str]:
    """Continue a PRUNED trial from its checkpoint, as `runyard sweep promote` does."""
    def act(s: Session) -> str:
        step = promote(s, trial_of(s, sweep_id, number), "ui")
        return f"Sweep {sweep_id}: trial {number} promoted; it continues from step {step}."

    return _request(act)


# -- how the pages say a sweep's numbers ---------------------------------------------------------


def value_text(value: float | None) -> str:
    return "–" if value is None else f"{value:.5g}"


def by_state_text(by_status: dict[str, int]) -> str:
    """Trials by state: ``2 RUNNING · 5 PRUNED · 1 SUCCEEDED``, the most first."""
    return " · ".join(f"{n} {s}" for s, n in sorted(by_status.items(), key=lambda sn: (-sn[1], sn[0])))


def spent_text(d: dict[str, Any]) -> str:
    """What a sweep spent: ``0.42 GPU-h · $0.0120 · 1h 02m``."""
    spent = d["spent"]
    return f"{spent['gpu_hours']:.3g} GPU-h · {usd(spent['usd'])} · {duration(spent['wall_hours'] * 3600)}"


def left_text(d: dict[str, Any]) -> str:
    """What its budget has left, per limit it has: ``1.6 GPU-h · $9.98``; "no limit" without one."""
    left = d["left"]
    parts = []
    if left["gpu_hours"] is not None:
        parts.append(f"{max(0.0, left['gpu_hours']):.3g} GPU-h")
    if left["usd"] is not None:
        parts.append(usd(max(0.0, left["usd"])))
    if left["wall_hours"] is not None:
        parts.append(duration(max(0.0, left["wall_hours"]) * 3600))
    return " · ".join(parts) or "no limit"


def eta_words(d: dict[str, Any]) -> str:
    """When the sweep ends: ``in 1h 20m``, ``ended``, or ``after its first trial ends``."""
    if d["eta_s"] is None:
        return "once a trial has ended"
    return "ended" if d["ended_at"] is not None or d["eta_s"] == 0 else f"in {duration(d['eta_s'])}"
