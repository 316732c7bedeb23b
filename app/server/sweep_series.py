"""The sweeps' series of ``GET /metrics`` (app/server/prometheus.py reads them in its one session).

A sweep has series while it is RUNNING or PAUSED and for the same window after it ended as a run
(``RUNYARD_METRICS_RECENT_S``): one label per sweep (``sweep``, its id), never one per trial, so
the labels stay bounded however many trials it makes. The numbers are the Sweeps page's and
``runyard sweep show``'s (db/sweeps/queries.py): a trial's state is its run's, the best value the
best trial's (the deepest trained, then the best there).

- ``runyard_sweep_info{sweep,name,searcher}`` 1;
- ``runyard_sweep_state{sweep,state}`` 1 for the sweep's state, 0 for each other;
- ``runyard_sweep_trials{sweep,state}``: its trials in each run state (every state, 0 included;
  ``REFUSED`` and ``DELETED`` for a trial without a run, when there is one);
- ``runyard_sweep_best{sweep,metric,goal}``: the best trial's value of the objective; absent
  before any;
- ``runyard_sweeps{state}``: how many sweeps of the database are in each state.
"""

from __future__ import annotations

import json
import math
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from db.models import Sweep
from db.states import RunStatus
from db.sweeps.queries import DELETED, REFUSED, best_trial, trials_of
from db.sweeps.states import SWEEP_TERMINAL, SweepStatus

# A trial's states: its run's, or one of the two a trial without a run has (shown when present).
TRIAL_STATES = tuple(s.value for s in RunStatus)
RUNLESS = (REFUSED, DELETED)


def read_sweeps(session: Session, now: float, recent_s: float) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The sweeps with series (not ended, or ended within ``recent_s``), each with its trials and
    objective, and how many sweeps there are in each state."""
    ended = [s.value for s in SWEEP_TERMINAL]
    rows = session.scalars(select(Sweep).where(or_(Sweep.status.not_in(ended), Sweep.ended_at >= now - recent_s))
                           .order_by(Sweep.id)).all()
    sweeps = []
    for sweep in rows:
        section = _section(sweep)
        sweeps.append({"id": sweep.id, "name": sweep.name, "status": sweep.status,
                       "searcher": str(section.get("searcher", "")), "metric": str(section.get("metric", "")),
                       "goal": str(section.get("goal", "minimize")), "trials": trials_of(session, sweep.id, now)})
    counts = {str(k): int(n) for k, n in session.execute(select(Sweep.status, func.count()).group_by(Sweep.status))}
    return sweeps, counts


def _section(sweep: Sweep) -> dict[str, Any]:
    value = json.loads(sweep.sweep_json)
    return value if isinstance(value, dict) else {}


def sweep_families(sweeps: list[dict[str, Any]], counts: dict[str, int]) -> list[Metric]:
    """The sweeps' metric families of one scrape, from :func:`read_sweeps`."""
    info = GaugeMetricFamily("runyard_sweep_info", "A sweep with series here (active, or ended recently): its name "
                             "and searcher.", labels=["sweep", "name", "searcher"])
    state = GaugeMetricFamily("runyard_sweep_state", "1 for the sweep's state, 0 for the others.",
                              labels=["sweep", "state"])
    trials = GaugeMetricFamily("runyard_sweep_trials", "The sweep's trials in each state (their runs' states).",
                               labels=["sweep", "state"])
    best = GaugeMetricFamily("runyard_sweep_best", "The objective's value of the sweep's best trial so far.",
                             labels=["sweep", "metric", "goal"])
    for s in sweeps:
        sweep = str(s["id"])
        info.add_metric([sweep, s["name"], s["searcher"]], 1)
        for st in SweepStatus:
            state.add_metric([sweep, st.value], 1 if s["status"] == st.value else 0)
        by_state: dict[str, int] = {}
        for t in s["trials"]:
            by_state[t["status"]] = by_state.get(t["status"], 0) + 1
        for name in (*TRIAL_STATES, *(r for r in RUNLESS if r in by_state)):
            trials.add_metric([sweep, name], by_state.get(name, 0))
        top = best_trial(s["trials"], s["goal"])
        if top is not None and not math.isnan(top["value"]):
            best.add_metric([sweep, s["metric"], s["goal"]], top["value"])
    total = GaugeMetricFamily("runyard_sweeps", "Sweeps of the database in each state.", labels=["state"])
    for st in SweepStatus:
        total.add_metric([st.value], counts.get(st.value, 0))
    return [info, state, trials, best, total]
