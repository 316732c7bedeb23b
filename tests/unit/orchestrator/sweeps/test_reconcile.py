"""A sweep's pass, driven directly with the scheduler's tick on a real SQLite in tmp_path, its
trials fake runs (tests/unit/orchestrator/sweeps/fake_trials.py): trials made up to max_concurrent
and max_trials; ASHA stopping a trial at a rung and promoting it later, the promoted trial resuming
from its checkpoint; the breaker; the budget; a second scheduler going on with the same suggestions
and no trial twice. And the decision table itself, without a database."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.run_actions import CANCELLABLE
from app.server.prometheus import RunyardCollector
from app.style import STATUS_BADGE
from db.models import Attempt, Checkpoint, Run, Sweep
from db.states import RESUMABLE, TERMINAL, RunStatus
from db.sweeps.queries import sweep_detail
from db.sweeps.requests import request_prune, trial_of
from db.vocabulary.config import parse_config
from db.vocabulary.settings import Settings
from orchestrator.cli.read import _status_filter
from orchestrator.sweeps.reconcile import RULES, Next, Plan, SweepJob, decide
from orchestrator.sweeps.searchers import history_from_json, suggest
from tests.unit.orchestrator.sweeps.fake_trials import BASE, drive, end, machine, report, run_of, start, status, trials


def sweep_row(sessions: sessionmaker[Session], sweep_id: int) -> tuple[str, str | None]:
    with sessions() as s:
        sweep = s.get(Sweep, sweep_id)
        assert sweep is not None
        return sweep.status, sweep.status_reason


def test_trials_are_made_up_to_max_concurrent_then_max_trials(sessions: sessionmaker[Session],
                                                              settings: Settings) -> None:
    sweep_id = start(sessions, max_trials=3, max_concurrent=2)
    scheduler, job = machine(sessions, settings)
    job.run()
    job.run()  # a second pass makes nothing more: two are training
    made = trials(sessions, sweep_id)
    assert [t["number"] for t in made] == [0, 1]
    assert sweep_row(sessions, sweep_id) == (
        "RUNNING", "2 trial(s) training (max_concurrent = 2): the next starts when one ends")
    first = run_of(sessions, sweep_id, 0)
    assert first.name == "lr-t0" and json.loads(first.tags_json) == [f"sweep:{sweep_id}"]
    assert json.loads(first.config_json)["train"]["lr"] == made[0]["params"]["train.lr"]
    assert "sweep" not in json.loads(first.config_json)  # a trial's config is a run's
    drive(scheduler, job, lambda: status(sessions, first.id) == "STARTING")
    for number, value in ((0, 0.7), (1, 0.3)):
        run = run_of(sessions, sweep_id, number)
        report(sessions, run.id, 40, value)
        end(sessions, run.id)
    drive(scheduler, job, lambda: len(trials(sessions, sweep_id)) == 3)
    third = run_of(sessions, sweep_id, 2)
    drive(scheduler, job, lambda: status(sessions, third.id) in ("STARTING", "RUNNING"))
    report(sessions, third.id, 40, 0.5)
    end(sessions, third.id)
    drive(scheduler, job, lambda: sweep_row(sessions, sweep_id)[0] == "FINISHED")
    assert [t["objective"] for t in trials(sessions, sweep_id)] == [0.7, 0.3, 0.5]  # rank 0's, at the end
    assert len({json.dumps(t["params"]) for t in trials(sessions, sweep_id)}) == 3
    with sessions() as s:
        detail = sweep_detail(s, sweep_id)
    assert detail is not None and detail["best"]["number"] == 1 and detail["by_status"] == {"SUCCEEDED": 3}


def test_asha_stops_a_trial_at_a_rung_and_promotes_it_later_from_its_checkpoint(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    # Rungs at steps 10 and 20 of 40 (min_steps 10, reduction 2, a checkpoint every 10 steps).
    sweep_id = start(sessions, max_trials=4, max_concurrent=2, early_stop={"reduction": 2, "min_steps": 10})
    scheduler, job = machine(sessions, settings)
    with sessions() as s:
        assert json.loads(s.get(Sweep, sweep_id).rungs_json) == [10, 20]  # type: ignore[union-attr]
    drive(scheduler, job, lambda: len(trials(sessions, sweep_id)) == 2)
    t0, t1 = run_of(sessions, sweep_id, 0), run_of(sessions, sweep_id, 1)
    drive(scheduler, job, lambda: status(sessions, t1.id) == "STARTING")
    report(sessions, t0.id, 10, 0.5)
    job.run()  # alone at rung 0: fewer than 2 values, it continues
    report(sessions, t1.id, 10, 0.6)
    report(sessions, t1.id, 12, 0.6)  # trained on past the rung: stopped at its next checkpoint, 12
    drive(scheduler, job, lambda: status(sessions, t1.id) == "PRUNED")
    pruned = run_of(sessions, sweep_id, 1)
    assert pruned.status_reason is not None and pruned.status_reason.startswith(
        f"stopped early by sweep {sweep_id} (rung 0 at step 10: loss 0.6, cut 0.55) at step 12")
    assert trials(sessions, sweep_id)[1]["prune"] == {"rung": 0, "step": 10, "value": 0.6, "cut": 0.55,
                                                      "metric": "loss"}
    # Two worse trials later: 0.6 is now among the best 2 of 4 at rung 0, and trial 1 continues.
    def made(n: int) -> Callable[[], bool]:
        return lambda: len(trials(sessions, sweep_id)) > n

    def reached(run_id: int, state: str) -> Callable[[], bool]:
        return lambda: status(sessions, run_id) == state

    for number, value in ((2, 0.9), (3, 0.95)):
        drive(scheduler, job, made(number))
        run = run_of(sessions, sweep_id, number)
        drive(scheduler, job, reached(run.id, "STARTING"))
        report(sessions, run.id, 10, value)
        drive(scheduler, job, reached(run.id, "PRUNED"))
    drive(scheduler, job, lambda: trials(sessions, sweep_id)[1]["promoted"] == 1)
    drive(scheduler, job, lambda: status(sessions, t1.id) == "STARTING")
    with sessions() as s:
        attempts = s.scalars(select(Attempt).where(Attempt.run_id == t1.id).order_by(Attempt.number)).all()
        assert [(a.number, a.status, a.resume_step) for a in attempts] == [(1, "PAUSED", None), (2, "RUNNING", 12)]
    # Promoted, it trains on and passes rung 1 first (alone there: it continues), then trial 0
    # with a better value (it continues too); both finish. Each pass judges what it has seen: had
    # both reached rung 1 before one pass, trial 1 would be judged second, below the cut.
    for run_id, value in ((t1.id, 0.45), (t0.id, 0.4)):
        report(sessions, run_id, 20, value)
        job.run()
    assert [t["rung"] for t in trials(sessions, sweep_id)] == [1, 1, 0, 0]
    for run_id, value in ((t0.id, 0.3), (t1.id, 0.35)):
        report(sessions, run_id, 40, value)
        end(sessions, run_id)
    drive(scheduler, job, lambda: sweep_row(sessions, sweep_id)[0] == "FINISHED")
    assert [status(sessions, run_of(sessions, sweep_id, n).id) for n in range(4)] == [
        "SUCCEEDED", "SUCCEEDED", "PRUNED", "PRUNED"]


def test_the_breaker_stops_the_sweep_when_trials_fail_with_the_same_error(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    sweep_id = start(sessions, max_trials=6, max_concurrent=2, budget={"max_failed": 2})
    scheduler, job = machine(sessions, settings, slots=3)
    drive(scheduler, job, lambda: len(trials(sessions, sweep_id)) == 2)
    first, second = run_of(sessions, sweep_id, 0), run_of(sessions, sweep_id, 1)
    drive(scheduler, job, lambda: status(sessions, second.id) == "STARTING")
    end(sessions, first.id, 1)
    drive(scheduler, job, lambda: len(trials(sessions, sweep_id)) == 3)  # one failure: the sweep goes on
    end(sessions, second.id, 1)
    drive(scheduler, job, lambda: sweep_row(sessions, sweep_id)[0] == "STOPPED")
    reason = sweep_row(sessions, sweep_id)[1]
    assert reason == ("stopped: 2 trials failed with the same error (ValueError: the learning rate diverged (at "
                      "train.py:3 in <module>)): the breaker stops the sweep (sweep.budget.max_failed = 2); fix it, "
                      "then start a new sweep")
    third = run_of(sessions, sweep_id, 2)  # training when it tripped: stopped gracefully, not failed
    drive(scheduler, job, lambda: status(sessions, third.id) == "PRUNED")
    assert len(trials(sessions, sweep_id)) == 3


def test_the_budget_stops_the_sweep_and_its_training_trials(sessions: sessionmaker[Session],
                                                            settings: Settings) -> None:
    sweep_id = start(sessions, max_trials=10, max_concurrent=2, budget={"gpu_hours": 0.0005})  # 1.8 device-seconds
    scheduler, job = machine(sessions, settings)
    drive(scheduler, job, lambda: sweep_row(sessions, sweep_id)[0] == "STOPPED", timeout=30)
    assert (sweep_row(sessions, sweep_id)[1] or "").startswith("stopped: its budget is reached: ")
    assert "of sweep.budget.gpu_hours = 0.0005 GPU-hours spent" in (sweep_row(sessions, sweep_id)[1] or "")
    made = trials(sessions, sweep_id)
    assert len(made) == 2  # nothing started after
    drive(scheduler, job, lambda: all(status(sessions, t["run_id"]) == "PRUNED" for t in made))
    assert made[0]["prune"] == {"why": sweep_row(sessions, sweep_id)[1]}


def test_a_second_scheduler_goes_on_with_the_same_suggestions_and_no_trial_twice(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    sweep_id = start(sessions, max_trials=5, max_concurrent=2, searcher="tpe", seed=11,
                     space={"train.lr": {"log_uniform": [1e-4, 1e-2]}, "workload.hidden": {"choice": [32, 64, 128]}})
    scheduler, job = machine(sessions, settings)
    drive(scheduler, job, lambda: len(trials(sessions, sweep_id)) == 2)
    first = run_of(sessions, sweep_id, 0)
    drive(scheduler, job, lambda: status(sessions, first.id) == "STARTING")
    report(sessions, first.id, 40, 0.4)
    end(sessions, first.id)
    drive(scheduler, job, lambda: status(sessions, first.id) == "SUCCEEDED")
    # What the first scheduler would ask next, had it not been killed before its commit.
    with sessions() as s:
        detail = sweep_detail(s, sweep_id)
    assert detail is not None
    scheduler.close()
    again, again_job = machine(sessions, settings)  # a new scheduler on the same database
    drive(again, again_job, lambda: len(trials(sessions, sweep_id)) == 3)
    made = trials(sessions, sweep_id)
    section = parse_config({**BASE, "sweep": detail["sweep"]}).sweep
    assert section is not None
    params = {t["number"]: t["params"] for t in made}
    for t in made:  # every suggestion made again from what was stored with it
        assert suggest(section, 11, t["number"], history_from_json(t["history"], params)) == t["params"]
    assert json.loads(made[2]["history"])[0] == [0, "complete", 0.4, {}]
    with sessions() as s:
        runs = s.scalars(select(Run.name).order_by(Run.id)).all()
    assert runs == ["lr-t0", "lr-t1", "lr-t2"]  # one run a trial, none twice
    again.close()


def test_a_trial_whose_config_is_refused_makes_no_run_and_says_why(sessions: sessionmaker[Session],
                                                                   settings: Settings) -> None:
    # 7 is a whole number of ranks, which this 2-slot machine cannot hold: refused like a submit.
    sweep_id = start(sessions, slots=8, max_trials=1, searcher="grid",
                     space={"launch.nproc_per_node": {"choice": [7]}}, budget={"max_failed": 0})
    _scheduler, job = machine(sessions, settings)
    job.run()
    (refused,) = trials(sessions, sweep_id)
    assert refused["run_id"] is None
    with sessions() as s:
        detail = sweep_detail(s, sweep_id)
        assert s.scalar(select(Checkpoint.id)) is None
    assert detail is not None and detail["trials"][0]["status"] == "REFUSED"
    assert "launch.nproc_per_node" in (detail["trials"][0]["error"] or "")
    assert sweep_row(sessions, sweep_id)[0] == "FINISHED"


# -- the decision, without a database ----------------------------------------------------------

PLAN = Plan(status="RUNNING", active=1, held=0, started=3, max_trials=9, max_concurrent=2, breaker=None,
            budget=None, promotable=())


@pytest.mark.parametrize(("name", "changes", "expected"), [
    ("room and trials left: the next starts", {}, Next.START),
    ("the breaker first", {"breaker": "2 trials failed", "budget": "spent"}, Next.BREAKER),
    ("then the budget", {"budget": "spent"}, Next.BUDGET),
    ("a paused sweep starts nothing", {"status": "PAUSED"}, Next.HELD),
    ("a paused sweep's breaker waits for its resume", {"status": "PAUSED", "breaker": "x"}, Next.HELD),
    ("max_concurrent training: it waits", {"active": 2}, Next.FULL),
    ("a promotion before a new trial", {"promotable": (1,)}, Next.PROMOTE),
    ("a promotion waits for room too", {"promotable": (1,), "active": 2}, Next.FULL),
    ("max_trials made, one training: it waits", {"started": 9}, Next.WAIT),
    ("the searcher has nothing new, one training", {"exhausted": True}, Next.WAIT),
    ("max_trials made, none training: finished", {"started": 9, "active": 0}, Next.FINISH),
    ("a trial paused by a person holds the end", {"started": 9, "active": 0, "held": 1}, Next.WAIT),
    ("max_trials raised meanwhile: it goes on", {"started": 9, "max_trials": 12, "active": 0}, Next.START),
])
def test_what_a_sweep_does_next(name: str, changes: dict[str, Any], expected: Next) -> None:
    assert decide(Plan(**{**PLAN.__dict__, **changes})) is expected


def test_every_answer_has_a_rule_and_an_applier() -> None:
    from orchestrator.sweeps.reconcile import APPLIERS  # noqa: PLC0415 - beside the table it checks

    assert {found for found, _ in RULES} == set(Next) == set(APPLIERS)
    assert SweepJob.due.__doc__  # the job says which sweeps it visits


def test_pruned_is_everywhere_a_status_is_listed(sessions: sessionmaker[Session], settings: Settings) -> None:
    """A pruned trial in the state machine, the UI's badges and actions, the CLI's status filter and
    the Prometheus state series; cancelled for good like a paused run, resumable like one."""
    assert RunStatus.PRUNED in TERMINAL and RunStatus.PRUNED in RESUMABLE and RunStatus.PRUNED in CANCELLABLE
    assert set(STATUS_BADGE) == {s.value for s in RunStatus}
    assert _status_filter(("pruned",)) == ["PRUNED"]
    sweep_id = start(sessions, max_trials=1, early_stop={"reduction": 2, "min_steps": 10})
    scheduler, job = machine(sessions, settings)
    drive(scheduler, job, lambda: len(trials(sessions, sweep_id)) == 1)
    run = run_of(sessions, sweep_id, 0)
    with sessions() as s:
        request_prune(s, trial_of(s, sweep_id, 0), {"why": "a test"}, "the test")
        s.commit()
    drive(scheduler, job, lambda: status(sessions, run.id) == "PRUNED")
    registry = CollectorRegistry()
    registry.register(RunyardCollector(lambda: sessions, settings.scheduler_file))
    exposed = generate_latest(registry).decode()
    assert f'runyard_run_state{{run_id="{run.id}",state="PRUNED"}} 1.0' in exposed
    assert 'runyard_queue_runs{state="PRUNED"} 1.0' in exposed
    scheduler.close()
