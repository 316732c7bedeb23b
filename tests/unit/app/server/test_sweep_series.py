"""The sweeps' series of ``GET /metrics`` (app/server/sweep_series.py), rendered in the text
exposition format and read back with prometheus_client's parser as Prometheus would: trials by
state (PRUNED among them), the best value, sweeps by state; one label per sweep, none per trial;
only active and recently ended sweeps have series. The numbers are ``runyard sweep show``'s.

    pytest tests/unit/app/server/test_sweep_series.py
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.server.prometheus import RunyardCollector
from db.models import SweepTrial
from db.requests import create_run
from db.states import RunStatus, transition
from db.sweeps.queries import sweep_detail
from db.sweeps.states import SweepStatus, sweep_transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.sweeps.submission import start_sweep, validate_sweep
from tests.unit.app.server.test_prometheus import collector, scrape

pytestmark = pytest.mark.both_dbs

BASE: dict[str, Any] = {"name": "lr", "train": {"max_steps": 40}, "checkpoint": {"every_steps": 10}}
PATHS = {"SUCCEEDED": ("STARTING", "RUNNING", "SUCCEEDED"), "PRUNED": ("STARTING", "RUNNING", "PAUSING", "PRUNED"),
         "RUNNING": ("STARTING", "RUNNING"), "FAILED": ("STARTING", "RUNNING", "FAILED")}


def _sweep(sessions: sessionmaker[Session], settings: Settings, name: str, goal: str,
           trials: list[tuple[str, float | None]]) -> int:
    """A sweep of ``trials`` (the run's status, the trial's objective), made as the sweeps job makes them."""
    section = {"metric": "eval_loss", "goal": goal, "space": {"train.lr": {"uniform": [0.001, 0.1]}}}
    sweep_id = start_sweep(sessions, validate_sweep({**BASE, "name": name, "sweep": section},
                                                    Inventory(kind="cpu", slots=2)))
    with sessions() as s:
        for number, (state, objective) in enumerate(trials):
            run = create_run(s, RunConfig.model_validate({**BASE, "name": f"{name}-t{number}"}), settings.runs_dir,
                             Price(usd_per_hour=0.0, unit="test-hour"))
            s.flush()
            for to in PATHS[state]:
                assert transition(s, run.id, RunStatus(to), f"test: {to}")
            s.add(SweepTrial(sweep_id=sweep_id, number=number, run_id=run.id, params_json=json.dumps(
                {"train.lr": 0.01 * (number + 1)}), objective=objective,
                objective_step=40 if objective is not None else None, created_at=time.time()))
        s.commit()
    return sweep_id


def _end(sessions: sessionmaker[Session], sweep_id: int, ended_ago: float) -> None:
    with sessions() as s:
        assert sweep_transition(s, sweep_id, SweepStatus.FINISHED, "finished: every trial has ended",
                                now=time.time() - ended_ago)
        s.commit()


def test_each_sweep_has_its_trials_by_state_and_its_best_value(settings: Settings,
                                                               sessions: sessionmaker[Session]) -> None:
    live = _sweep(sessions, settings, "live", "minimize",
                  [("SUCCEEDED", 0.4), ("PRUNED", None), ("PRUNED", None), ("RUNNING", None), ("SUCCEEDED", 0.3)])
    done = _sweep(sessions, settings, "done", "maximize", [("SUCCEEDED", 0.9), ("FAILED", None)])
    _end(sessions, done, ended_ago=60)
    old = _sweep(sessions, settings, "old", "minimize", [("SUCCEEDED", 0.1)])
    _end(sessions, old, ended_ago=7200)
    got = scrape(collector(sessions, settings))
    assert {dict(k)["sweep"] for k in got.samples["runyard_sweep_info"]} == {str(live), str(done)}  # not the old one
    assert got.get("runyard_sweep_info", sweep=str(live), name="live", searcher="random") == 1
    expected = {live: {"SUCCEEDED": 2, "PRUNED": 2, "RUNNING": 1}, done: {"SUCCEEDED": 1, "FAILED": 1}}
    for sweep_id, counts in expected.items():
        with sessions() as s:
            shown = sweep_detail(s, sweep_id)
        assert shown is not None and shown["by_status"] == counts  # what `runyard sweep show` says
        for state in RunStatus:
            assert got.get("runyard_sweep_trials", sweep=str(sweep_id), state=state.value) == \
                counts.get(state.value, 0), (sweep_id, state)
        for sweep_state in SweepStatus:
            assert got.get("runyard_sweep_state", sweep=str(sweep_id), state=sweep_state.value) == \
                (1 if sweep_state.value == shown["status"] else 0), (sweep_id, sweep_state)
    # (Scrape.get's first argument is the series' name: a label named "metric" goes by the samples.)
    assert got.samples["runyard_sweep_best"] == {
        frozenset({("sweep", str(live)), ("metric", "eval_loss"), ("goal", "minimize")}): pytest.approx(0.3),
        frozenset({("sweep", str(done)), ("metric", "eval_loss"), ("goal", "maximize")}): pytest.approx(0.9)}
    # Sweeps by state count every sweep of the database, the old one too.
    assert {s.value: got.get("runyard_sweeps", state=s.value) for s in SweepStatus} == {
        "RUNNING": 1, "PAUSED": 0, "FINISHED": 2, "STOPPED": 0, "CANCELLED": 0}
    # No label names a trial or its run: one series per sweep and state, however many trials.
    sweep_labels = {name for metric, series in got.samples.items() if metric.startswith("runyard_sweep")
                    for key in series for name, _ in key}
    assert sweep_labels == {"sweep", "name", "searcher", "state", "metric", "goal"}


def test_a_sweep_without_a_value_yet_has_no_best_and_before_the_database_only_zeros(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    fresh = _sweep(sessions, settings, "fresh", "minimize", [("RUNNING", None)])
    got = scrape(collector(sessions, settings))
    assert got.get("runyard_sweep_trials", sweep=str(fresh), state="RUNNING") == 1
    assert "runyard_sweep_best" not in got.samples  # no trial has a value yet
    empty = scrape(RunyardCollector(lambda: None, settings.scheduler_file))
    assert {empty.get("runyard_sweeps", state=s.value) for s in SweepStatus} == {0}
