"""A sweep's end, told (orchestrator/alerts/sweep_triggers.py): FINISHED with its best trial and
value, STOPPED by its breaker (which error, how many times) or by its budget (which limit, spent
against it); each once, even to a restarted scheduler; following the sweep's base [alerts] and the
channels' --on as a run's alerts do. The sweeps are real (the sweeps job over fake trials,
tests/unit/orchestrator/sweeps/fake_trials.py) on a real SQLite.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from db.models import Sweep
from db.sweeps.states import SweepStatus, sweep_transition
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.alerts.engine import AlertEngine
from orchestrator.alerts.store import AlertStore
from orchestrator.sweeps.submission import start_sweep, validate_sweep
from tests.alert_receivers import http_receiver
from tests.unit.orchestrator.alerts.alert_runs import drain, engine_and_worker
from tests.unit.orchestrator.sweeps.fake_trials import drive, end, machine, report, run_of, status, trials

BASE: dict[str, Any] = {"name": "lr", "launch": {"nproc_per_node": 1},
                        "train": {"max_steps": 40, "log_every": 1, "eval_every": 0},
                        "checkpoint": {"every_steps": 10}, "retry": {"max_retries": 0}}


def start(sessions: sessionmaker[Session], alerts: dict[str, Any] | None = None, **sweep: Any) -> int:
    section = {"metric": "loss", "searcher": "grid", "space": {"train.lr": {"choice": [0.1, 0.01, 0.001]}}, **sweep}
    config = validate_sweep({**BASE, **({"alerts": alerts} if alerts else {}), "sweep": section},
                            Inventory(kind="cpu", slots=2))
    return start_sweep(sessions, config)


def sweep_status(sessions: sessionmaker[Session], sweep_id: int) -> str:
    with sessions() as s:
        return s.get_one(Sweep, sweep_id).status


def tell(sessions: sessionmaker[Session], settings: Settings) -> None:
    """Two alert passes of one engine and one of a restarted scheduler's, then every delivery sent."""
    engine, worker = engine_and_worker(sessions, settings)
    engine.evaluate()
    engine.evaluate()
    AlertEngine(sessions, settings.home).evaluate()  # a scheduler restarted: the key is told once
    drain(worker)


def test_a_finished_sweep_is_told_once_with_its_best_trial(sessions: sessionmaker[Session],
                                                           settings: Settings) -> None:
    sweep_id = start(sessions, max_trials=2, max_concurrent=2)
    scheduler, job = machine(sessions, settings)
    drive(scheduler, job, lambda: len(trials(sessions, sweep_id)) == 2)
    runs = [run_of(sessions, sweep_id, n) for n in (0, 1)]
    drive(scheduler, job, lambda: all(status(sessions, r.id) == "STARTING" for r in runs))
    for run, value in zip(runs, (0.7, 0.25), strict=True):
        report(sessions, run.id, 40, value)
        end(sessions, run.id)
    drive(scheduler, job, lambda: sweep_status(sessions, sweep_id) == "FINISHED")
    with http_receiver() as receiver:
        AlertStore(settings.home).add(receiver.url("runyard+http", "/hook"))
        tell(sessions, settings)
        posts = [p.json for p in receiver.posts]
    (post,) = posts
    assert post["trigger"] == "sweep_finished" and post["kind"] == "fire" and post["run"] is None
    assert post["sweep"] == {"id": sweep_id, "name": "lr", "status": "FINISHED"}
    assert post["link"].endswith(f"/sweep?id={sweep_id}") and post["title"].endswith(f"sweep {sweep_id} (lr)")
    message = post["message"]
    assert message.startswith(f"sweep {sweep_id} (lr) FINISHED after ")
    assert "2 trial(s) (2 SUCCEEDED)" in message
    assert (f"best trial 1 (run {runs[1].id}): loss 0.25 at its end (minimize) with train.lr=0.01; "
            f"`runyard sweep best {sweep_id}` prints its config") in message


def test_the_breaker_is_told_with_the_error_and_the_count(sessions: sessionmaker[Session],
                                                          settings: Settings) -> None:
    sweep_id = start(sessions, max_trials=3, max_concurrent=2, budget={"max_failed": 2})
    scheduler, job = machine(sessions, settings)
    drive(scheduler, job, lambda: len(trials(sessions, sweep_id)) == 2)
    runs = [run_of(sessions, sweep_id, n) for n in (0, 1)]
    drive(scheduler, job, lambda: all(status(sessions, r.id) == "STARTING" for r in runs))
    for run in runs:
        end(sessions, run.id, 1)
    drive(scheduler, job, lambda: sweep_status(sessions, sweep_id) == "STOPPED")
    with http_receiver() as receiver:
        AlertStore(settings.home).add(receiver.url("runyard+http", "/hook"))
        tell(sessions, settings)
        posts = [p.json for p in receiver.posts]
    made = trials(sessions, sweep_id)  # a third, made after the first failure, is stopped at a checkpoint
    drive(scheduler, job, lambda: all(status(sessions, t["run_id"]) in ("FAILED", "PRUNED") for t in made))
    (post,) = [p for p in posts if p["trigger"].startswith("sweep_")]
    assert post["trigger"] == "sweep_breaker"
    assert post["message"].startswith(
        f"sweep {sweep_id} (lr) STOPPED after ")
    assert ("2 trials failed with the same error (ValueError: the learning rate diverged (at train.py:3 in "
            "<module>)): the breaker stops the sweep (sweep.budget.max_failed = 2); fix it, then start a new sweep; "
            f"`runyard logs {runs[1].id}` shows a failing trial's log") in post["message"]
    assert sorted(p["trigger"] for p in posts) == ["failed", "failed", "sweep_breaker"]  # each trial's own too


def test_the_budget_is_told_with_the_limit_and_what_was_spent(sessions: sessionmaker[Session],
                                                              settings: Settings) -> None:
    sweep_id = start(sessions, max_trials=3, max_concurrent=2, budget={"gpu_hours": 0.0005})  # 1.8 device-seconds
    scheduler, job = machine(sessions, settings)
    drive(scheduler, job, lambda: sweep_status(sessions, sweep_id) == "STOPPED")
    with http_receiver() as receiver:
        AlertStore(settings.home).add(receiver.url("runyard+http", "/hook"))
        tell(sessions, settings)
        posts = [p.json for p in receiver.posts]
        made = trials(sessions, sweep_id)
        drive(scheduler, job, lambda: all(status(sessions, t["run_id"]) == "PRUNED" for t in made))
    (post,) = posts
    assert post["trigger"] == "sweep_budget"
    message = post["message"]
    assert message.startswith(f"sweep {sweep_id} (lr) STOPPED after ")
    assert "its budget is reached: " in message and " of sweep.budget.gpu_hours = 0.0005 GPU-hours spent" in message
    assert (f"trial(s) 0, 1 were training: each stops at a checkpoint (PRUNED; `runyard sweep promote {sweep_id} "
            "TRIAL` continues one)") in message
    assert "no trial reported loss" in message


def test_a_sweeps_alerts_follow_its_base_alerts_and_the_channels_on(sessions: sessionmaker[Session],
                                                                      settings: Settings) -> None:
    silenced = start(sessions, alerts={"off": ["sweep_finished"]}, max_trials=1)
    only_two = start(sessions, alerts={"channels": ["2"]}, max_trials=1)
    with sessions() as s:
        for sweep_id in (silenced, only_two):
            sweep_transition(s, sweep_id, SweepStatus.FINISHED, "finished: every trial has ended")
        s.commit()
    with http_receiver() as receiver:
        store = AlertStore(settings.home)
        store.add(receiver.url("runyard+http", "/all"))
        store.add(receiver.url("runyard+http", "/two"))
        store.add(receiver.url("runyard+http", "/failures"), on=("failed",))
        tell(sessions, settings)
        posts = [(p.path, p.json["sweep"]["id"], p.json["trigger"]) for p in receiver.posts]
    assert posts == [("/two", only_two, "sweep_finished")]
