"""What the UI and the CLI read of sweeps, as plain data: the list with each sweep's trials by
status, best trial and budget, and one sweep with its trials, rung table, spending and history."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, SweepTrial
from db.requests import create_run
from db.states import RunStatus, transition
from db.sweeps.queries import best_trial, goal_score, sweep_detail, sweep_list
from db.sweeps.requests import create_sweep
from db.vocabulary.config import RunConfig, parse_config
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings

SWEEP = {"name": "lr", "sweep": {"metric": "eval_loss", "space": {"train.lr": {"log_uniform": [1e-4, 1e-2]}},
                                 "max_trials": 6, "max_concurrent": 2, "early_stop": {"reduction": 3},
                                 "budget": {"usd": 10.0}}}
NOW = 10_000.0

# (status the run ends in, params, {rung: [step, value]}, objective at the end, attempts' seconds)
TRIALS: list[tuple[str, dict[str, float], dict[str, list[float]], float | None, list[tuple[float, float | None]]]] = [
    ("SUCCEEDED", {"train.lr": 1e-3}, {"0": [100, 0.5], "1": [300, 0.4]}, 0.3, [(100.0, 200.0)]),
    ("PRUNED", {"train.lr": 1e-2}, {"0": [100, 0.9]}, None, [(100.0, 130.0)]),
    ("RUNNING", {"train.lr": 1e-4}, {"0": [100, 0.6]}, None, [(150.0, None)]),
]


def _fill(sessions: sessionmaker[Session], settings: Settings) -> int:
    with sessions() as s:
        sweep = create_sweep(s, parse_config(SWEEP), [100, 300], now=0.0)
        for number, (status, params, rungs, objective, spans) in enumerate(TRIALS):
            run = create_run(s, RunConfig(name=f"lr-t{number}"), settings.runs_dir, Price(3.6, "test"))
            for to in (RunStatus.STARTING, RunStatus.RUNNING):
                transition(s, run.id, to, "launch")
            if status == "SUCCEEDED":
                transition(s, run.id, RunStatus.SUCCEEDED, "done")
            elif status == "PRUNED":
                transition(s, run.id, RunStatus.PAUSING, "prune")
                transition(s, run.id, RunStatus.PRUNED, "stopped early")
            for i, (start, end) in enumerate(spans, 1):
                s.add(Attempt(run_id=run.id, number=i, status="RUNNING", dir="/x", started_at=start, ended_at=end,
                              last_step=130 if status == "PRUNED" else 300, devices_json="[]"))
            s.add(SweepTrial(sweep_id=sweep.id, number=number, run_id=run.id, params_json=json.dumps(params),
                             rung=max(map(int, rungs)), rungs_json=json.dumps(rungs), objective=objective,
                             objective_step=300 if objective is not None else None, created_at=float(number),
                             prune_json='{"rung": 0, "step": 100, "value": 0.9, "cut": 0.6}' if status == "PRUNED"
                             else None))
        s.add(SweepTrial(sweep_id=sweep.id, number=3, run_id=None, params_json="{}", error="launch.nproc_per_node",
                         created_at=3.0))
        s.commit()
        return sweep.id


def test_one_sweep_with_its_trials_rungs_spending_and_history(sessions: sessionmaker[Session],
                                                              settings: Settings) -> None:
    sweep_id = _fill(sessions, settings)
    with sessions() as s:
        d = sweep_detail(s, sweep_id, now=NOW)
        assert sweep_detail(s, sweep_id + 1) is None
    assert d is not None
    assert (d["name"], d["status"], d["metric"], d["goal"], d["searcher"], d["rungs"], d["reduction"]) == (
        "lr", "RUNNING", "eval_loss", "minimize", "random", [100, 300], 3)
    assert [t["status"] for t in d["trials"]] == ["SUCCEEDED", "PRUNED", "RUNNING", "REFUSED"]
    assert d["by_status"] == {"SUCCEEDED": 1, "PRUNED": 1, "RUNNING": 1, "REFUSED": 1}
    done, pruned, running, refused = d["trials"]
    assert (done["value"], done["level"], done["objective"]) == (0.3, 3, 0.3)
    assert (pruned["value"], pruned["level"], pruned["stopped_at"], pruned["prune"]["cut"]) == (0.9, 1, 130, 0.6)
    assert running["rungs"] == {0: {"step": 100, "value": 0.6}} and running["stopped_at"] is None
    assert refused["run_id"] is None and refused["error"] == "launch.nproc_per_node"
    assert d["best"]["number"] == 0
    assert d["rung_table"] == [{"rung": 0, "step": 100, "values": [0.5, 0.9, 0.6], "count": 3, "kept": 1},
                               {"rung": 1, "step": 300, "values": [0.4], "count": 1, "kept": 0}]
    # Device time: a CPU attempt counts its ranks (2 here); 3.6 USD an hour (the run's) is 0.001 a second.
    seconds = 100.0 + 30.0 + (NOW - 150.0)
    assert d["spent"]["gpu_hours"] == pytest.approx(2 * seconds / 3600)
    assert d["spent"]["usd"] == pytest.approx(seconds * 0.001)
    assert d["spent"]["wall_hours"] == pytest.approx(NOW / 3600)
    assert d["budget"] == {"gpu_hours": 0.0, "usd": 10.0, "wall_hours": 0.0}
    assert d["left"]["usd"] == pytest.approx(10.0 - seconds * 0.001) and d["left"]["gpu_hours"] is None
    # Two ended trials of 100 and 30 s: 2 trials still to start and one running already past the mean.
    assert d["eta_s"] == pytest.approx((2 * 65.0 + 0.0) / 2)
    assert [h["to"] for h in d["history"]] == ["RUNNING"]
    assert d["base"]["name"] == "lr" and "sweep" not in d["base"] and d["space"] == ["train.lr"]


def test_the_sweeps_list(sessions: sessionmaker[Session], settings: Settings) -> None:
    first = _fill(sessions, settings)
    second = _fill(sessions, settings)
    with sessions() as s:
        listed = sweep_list(s, now=NOW)
    assert [row["id"] for row in listed] == [second, first]  # newest first
    assert listed[0]["trial_count"] == 4 and listed[0]["best"]["value"] == 0.3
    assert "trials" not in listed[0]  # the list carries counts, the detail the trials


def test_the_best_trial_is_the_deepest_then_the_best_there() -> None:
    trials = [{"number": 0, "value": 0.2, "level": 1}, {"number": 1, "value": 0.5, "level": 2},
              {"number": 2, "value": 0.4, "level": 2}, {"number": 3, "value": float("nan"), "level": 3}]
    best = best_trial(trials, "minimize")
    assert best is not None and best["number"] == 2
    best_max = best_trial(trials, "maximize")
    assert best_max is not None and best_max["number"] == 1
    assert best_trial([], "minimize") is None
    assert goal_score(None, "maximize") == goal_score(float("nan"), "minimize") == float("-inf")
