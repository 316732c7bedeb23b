"""What a person or a sweep asks of a sweep and of its trials: a prune stops a training trial like a
pause (PAUSING with ``stop_mode = "prune"``) and a queued one at once, never losing it; a promotion
is a resume of a PRUNED trial from its newest verified checkpoint; a cancel takes the live trials
with it and leaves the pruned ones resumable; the limits change while it runs, not after."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Checkpoint, Run, SweepTrial
from db.requests import RequestRefused, create_run
from db.states import RunStatus, transition
from db.sweeps.requests import (
    SweepNotFound,
    cancel_sweep,
    create_sweep,
    edit_sweep,
    pause_sweep,
    promote,
    prune_words,
    request_prune,
    resolve_sweep,
    resume_or_promote,
    resume_sweep,
    trial_of,
)
from db.sweeps.states import SweepStatus, sweep_transition
from db.vocabulary.config import RunConfig, parse_config
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings

SWEEP = {"name": "lr", "sweep": {"space": {"train.lr": {"log_uniform": [1e-4, 1e-2]}}, "max_trials": 4}}
WHY = {"rung": 0, "step": 20, "value": 0.5123, "cut": 0.41, "metric": "eval_loss"}


def _sweep_with_trials(sessions: sessionmaker[Session], settings: Settings, n: int) -> tuple[int, list[int]]:
    """A sweep with ``n`` trials, each a QUEUED run."""
    with sessions() as s:
        sweep = create_sweep(s, parse_config(SWEEP), [])
        runs = []
        for number in range(n):
            run = create_run(s, RunConfig(name=f"lr-t{number}"), settings.runs_dir, Price(0.1, "test"))
            s.add(SweepTrial(sweep_id=sweep.id, number=number, run_id=run.id, params_json="{}", created_at=time.time()))
            runs.append(run.id)
        s.commit()
        return sweep.id, runs


def _status(sessions: sessionmaker[Session], run_id: int) -> str:
    with sessions() as s:
        run = s.get(Run, run_id)
        assert run is not None
        return run.status


def test_a_training_trial_is_pruned_like_a_pause_and_a_queued_one_at_once(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    sweep_id, (training, queued, paused) = _sweep_with_trials(sessions, settings, 3)
    with sessions() as s:
        for run_id in (training, paused):
            transition(s, run_id, RunStatus.STARTING, "launching")
            transition(s, run_id, RunStatus.RUNNING, "first step")
        transition(s, paused, RunStatus.PAUSING, "a person")
        s.commit()
        assert request_prune(s, trial_of(s, sweep_id, 0), WHY, f"sweep {sweep_id}")
        assert request_prune(s, trial_of(s, sweep_id, 1), {"why": "its budget is reached"}, f"sweep {sweep_id}")
        assert not request_prune(s, trial_of(s, sweep_id, 2), WHY, f"sweep {sweep_id}")  # being stopped already
        s.commit()
        run = s.get(Run, training)
        assert run is not None and run.status == "PAUSING" and run.stop_mode == "prune"
        assert run.status_reason == f"stopping early: sweep {sweep_id} (rung 0 at step 20: eval_loss 0.5123, cut 0.41)"
        assert prune_words(s, training) == f"sweep {sweep_id} (rung 0 at step 20: eval_loss 0.5123, cut 0.41)"
        assert prune_words(s, queued) == f"sweep {sweep_id} (its budget is reached)"
    assert _status(sessions, queued) == "PRUNED"


def test_a_promotion_resumes_a_pruned_trial_from_its_newest_verified_checkpoint(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    sweep_id, (run_id,) = _sweep_with_trials(sessions, settings, 1)
    with sessions() as s:
        trial = trial_of(s, sweep_id, 0)
        with pytest.raises(RequestRefused, match="is QUEUED: only a PRUNED trial can be promoted"):
            promote(s, trial, "user")
        for to in (RunStatus.STARTING, RunStatus.RUNNING):
            transition(s, run_id, to, "launch")
        request_prune(s, trial, WHY, "sweep")
        transition(s, run_id, RunStatus.PRUNED, "stopped early")
        s.add(Attempt(run_id=run_id, number=1, status="PAUSED", dir="/x", started_at=time.time()))
        for step, verified in ((20, True), (23, True), (30, False)):
            s.add(Checkpoint(run_id=run_id, attempt=1, step=step, path=f"/x/{step}", bytes=1, sha256="s",
                             params_digest="p", blocked_s=0, total_s=0, created_at=time.time(), verified=verified))
        s.commit()
        assert promote(s, trial, "sweep 1 (rung 0)") == 23
        s.commit()
        run = s.get(Run, run_id)
        assert run is not None and run.status == "QUEUED" and trial.promoted == 1
        resumed = s.get(Checkpoint, run.resume_checkpoint_id) if run.resume_checkpoint_id is not None else None
        assert resumed is not None and resumed.step == 23


def test_resuming_a_pruned_trial_from_its_newest_checkpoint_is_its_promotion(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    """The UI's Resume (app/data.py): a PRUNED trial is promoted, counted on its trial; from another
    checkpoint, or a run of no sweep, it is a resume like any."""
    sweep_id, (run_id, other) = _sweep_with_trials(sessions, settings, 2)
    with sessions() as s:
        for rid in (run_id, other):
            for to in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.PAUSING, RunStatus.PRUNED):
                transition(s, rid, to, "stopped early")
            s.add(Attempt(run_id=rid, number=1, status="PAUSED", dir="/x", started_at=time.time()))
            for step in (10, 20):
                s.add(Checkpoint(run_id=rid, attempt=1, step=step, path=f"/x/{rid}/{step}", bytes=1, sha256="s",
                                 params_digest="p", blocked_s=0, total_s=0, created_at=time.time(), verified=True))
        s.flush()
        older = s.scalars(select(Checkpoint.id).where(Checkpoint.run_id == other, Checkpoint.step == 10)).one()
        assert resume_or_promote(s, run_id, "ui") == 20
        assert resume_or_promote(s, other, "ui", checkpoint_id=older) == 10
        s.commit()
        assert (trial_of(s, sweep_id, 0).promoted, trial_of(s, sweep_id, 1).promoted) == (1, 0)
    assert _status(sessions, run_id) == _status(sessions, other) == "QUEUED"


def test_a_cancelled_sweep_cancels_its_live_trials_and_keeps_the_pruned_ones(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    sweep_id, (live, pruned, done) = _sweep_with_trials(sessions, settings, 3)
    with sessions() as s:
        transition(s, pruned, RunStatus.PRUNED, "stopped early before it ran")
        for to in (RunStatus.STARTING, RunStatus.SUCCEEDED):
            transition(s, done, to, "ran")
        s.commit()
        assert cancel_sweep(s, sweep_id) == f"sweep {sweep_id} cancelled; 1 trial(s) being cancelled"
        s.commit()
        with pytest.raises(RequestRefused, match="is already CANCELLED"):
            cancel_sweep(s, sweep_id)
    assert [_status(sessions, r) for r in (live, pruned, done)] == ["CANCELLED", "PRUNED", "SUCCEEDED"]


def test_pause_resume_and_edit_while_it_runs_not_after(sessions: sessionmaker[Session], settings: Settings) -> None:
    sweep_id, _ = _sweep_with_trials(sessions, settings, 0)
    with sessions() as s:
        assert "paused" in pause_sweep(s, sweep_id)
        with pytest.raises(RequestRefused, match="only a RUNNING sweep can be paused"):
            pause_sweep(s, sweep_id)
        assert edit_sweep(s, sweep_id, max_trials=9, max_concurrent=3) == (
            f"sweep {sweep_id}: max_trials 4 -> 9, max_concurrent 1 -> 3")
        assert resume_sweep(s, sweep_id) == f"sweep {sweep_id} resumed"
        sweep_transition(s, sweep_id, SweepStatus.FINISHED, "nothing left")
        s.commit()
        with pytest.raises(RequestRefused, match="an ended sweep stays ended"):
            resume_sweep(s, sweep_id)
        with pytest.raises(RequestRefused, match="is FINISHED: an ended sweep's limits"):
            edit_sweep(s, sweep_id, max_trials=20)


def test_a_sweep_is_named_by_id_or_by_name(sessions: sessionmaker[Session], settings: Settings) -> None:
    first, _ = _sweep_with_trials(sessions, settings, 0)
    second, _ = _sweep_with_trials(sessions, settings, 0)
    with sessions() as s:
        assert resolve_sweep(s, str(first)) == first and resolve_sweep(s, f"#{first}") == first
        assert resolve_sweep(s, "lr") == second  # the newest of that name
        for ref, words in (("77", "no sweep with id 77"), ("nope", "no sweep named 'nope'")):
            with pytest.raises(SweepNotFound, match=words):
                resolve_sweep(s, ref)
        with pytest.raises(SweepNotFound, match="has no trial 5"):
            trial_of(s, first, 5)
