"""A run's detail (db/queries.py's ``run_detail``) on SQLite and PostgreSQL: the same summary as the
per-run computation, a succeeded run one step off its total shown complete, a run queued to
resume shown at its lineage's numbers, and the ETA of a run waiting to retry with the restart it is
about to pay (the backoff left, its own measured restart, else the machine's median, and the steps
it redoes from its newest checkpoint), said in its basis.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy.orm import Session, sessionmaker

from bench.bench_runs_list import seed_runs
from db import queries
from db.metricstore import write_points
from db.models import Attempt, Checkpoint, Run
from db.queries import run_detail
from db.requests import create_run, request_resume
from db.run_list import list_runs
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from tests.unit.db.statements import reference_summary
from tests.unit.db.workspace_runs import workspace_run

pytestmark = pytest.mark.both_dbs


def test_run_detail_summary_is_the_per_run_computation(settings: Settings, sessions: sessionmaker[Session],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    with sessions() as s:
        ids = seed_runs(s, settings.runs_dir, 6, now=now - 5)
        s.commit()
    monkeypatch.setattr(time, "time", lambda: now)
    with sessions() as s:
        for run_id in ids:
            detail = queries.run_detail(s, run_id)
            run = s.get_one(Run, run_id)
            assert run is not None
            expected = reference_summary(s, run, now)
            assert {k: detail[k] for k in expected} == expected


@pytest.mark.parametrize(("last_step", "shown"), [(2999, 3000), (3001, 3000), (3000, 3000), (2990, 2990)])
def test_a_succeeded_run_one_step_off_its_total_shows_complete(
        settings: Settings, sessions: sessionmaker[Session], last_step: int, shown: int) -> None:
    """Lightning's last logged step is 2999 of 3000 (steps from 0); nanoGPT runs to 1500
    inclusive (1501 of 1500): done is done. A script that stopped early stays as it stopped."""
    with sessions() as s:
        run = create_run(s, RunConfig.model_validate({"name": "pl", "train": {"max_steps": 3000}}),
                         settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        for to in ("STARTING", "RUNNING", "SUCCEEDED"):
            transition(s, run.id, RunStatus(to), "t")
        s.add(Attempt(run_id=run.id, number=1, status="SUCCEEDED", dir="/tmp/a", started_at=1.0, ended_at=2.0,
                      last_step=last_step))
        s.commit()
        detail = queries.run_detail(s, run.id)
    assert detail["step"] == shown and detail["attempts"][0]["last_step"] == last_step


def test_a_run_queued_to_resume_shows_the_resume_step_no_eta_no_abandoned_eval_and_no_paused_time(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    """Issue 29 item 4: a run that reached step 10 (eval at 9), was paused for an hour, then queued
    to resume from its checkpoint at step 5: the page's numbers are the lineage's. Step 5 (not
    10), no ETA, no eval from step 9 (abandoned by the resume), elapsed the attempt's 100 s."""
    with sessions() as s:
        run_id = workspace_run(s, settings, "paused", ends=RunStatus.RUNNING)
        s.add(Attempt(run_id=run_id, number=1, status="PAUSED", dir="/nowhere", started_at=1000.0, ended_at=1100.0,
                      first_step_at=1001.0, last_step=10))
        s.add(Checkpoint(run_id=run_id, attempt=1, step=5, path="/c/5", bytes=1, sha256="0", params_digest="0",
                         blocked_s=0.1, total_s=0.2, created_at=1050.0))
        s.flush()
        write_points(s.connection(), [
            *({"run_id": run_id, "attempt": 1, "rank": 0, "step": i, "key": "loss", "value": 1.0 / i,
               "wall_time": 1000.0 + i} for i in range(1, 11)),
            {"run_id": run_id, "attempt": 1, "rank": 0, "step": 4, "key": "eval_accuracy", "value": 0.5,
             "wall_time": 1004.0},
            {"run_id": run_id, "attempt": 1, "rank": 0, "step": 9, "key": "eval_accuracy", "value": 0.9,
             "wall_time": 1009.0}])
        assert transition(s, run_id, RunStatus.PAUSING, "test")
        assert transition(s, run_id, RunStatus.PAUSED, "test", now=1100.0)
        s.commit()
        assert run_detail(s, run_id)["metrics"]["eval_accuracy"] == {"0": 0.9}  # paused at 10: step 9 is on it
        assert request_resume(s, run_id, step=5) == 5
        s.commit()
        detail = run_detail(s, run_id)
        assert (detail["status"], detail["step"], detail["progress"]) == ("QUEUED", 5, 0.05)
        assert detail["eta_s"] is None and detail["eta_range_s"] is None
        assert detail["elapsed_s"] == 100.0  # the hour it sat paused is not work
        assert detail["metrics"]["eval_accuracy"] == {"0": 0.5}  # step 4's, not the abandoned step 9's
        assert detail["metrics"]["loss"] == {"0": 1.0 / 5}
        (listed,) = list_runs(s)
        assert (listed["step"], listed["elapsed_s"]) == (5, 100.0)


def retrying_run(s: Session, settings: Settings, now: float, *, restarted_before: bool) -> int:
    """A run of 2000 steps that failed at step 1000 (10 steps/s) after a checkpoint at step 800 and
    waits 10 s more to retry; with ``restarted_before``, an earlier restart of its own took 6 s from
    launch to first step."""
    run = create_run(s, RunConfig.model_validate({"name": "r", "train": {"max_steps": 2000}}), settings.runs_dir,
                     Price(usd_per_hour=1.0, unit="cpu-hour"))
    for status in ("STARTING", "RUNNING", "RETRYING"):
        transition(s, run.id, RunStatus(status), "t")
    s.get_one(Run, run.id).retry_at = now + 10
    number = 1
    if restarted_before:
        s.add(Attempt(run_id=run.id, number=1, status="FAILED", dir="/tmp/a1", started_at=now - 400,
                      first_step_at=now - 396, ended_at=now - 300, last_step=50, cause="SIGNAL", failed_at=now - 300))
        number = 2
    started = now - 110
    s.add(Attempt(run_id=run.id, number=number, status="FAILED", dir="/tmp/a", started_at=started,
                  first_step_at=started + (6 if restarted_before else 4), ended_at=now - 5, last_step=1000,
                  cause="SIGNAL", failed_at=now - 5))
    s.add(Checkpoint(run_id=run.id, attempt=number, step=800, path="/c/800", bytes=1, sha256="0", params_digest="0",
                     blocked_s=0.1, total_s=0.2, created_at=now - 30))
    write_points(s.connection(), [{"run_id": run.id, "attempt": number, "rank": 0, "step": step, "key": "loss",
                                   "value": 1.0, "wall_time": now - 105 + step / 10} for step in range(10, 1001, 10)])
    return run.id


def test_a_retrying_run_pays_its_own_restart_then_the_steps_from_its_checkpoint(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    now = time.time()
    with sessions() as s:
        run_id = retrying_run(s, settings, now, restarted_before=True)
        s.commit()
        d = queries.run_detail(s, run_id, now=now)
    # 10 s backoff + its own 6 s restart + 1200 steps from step 800 at 10 steps/s.
    assert d["eta_s"] == pytest.approx(10 + 6 + 120, abs=0.5)
    assert d["eta_range_s"][0] <= d["eta_s"] <= d["eta_range_s"][1]
    assert "includes a restart of ~36 s: 10 s of backoff left, ~6 s to start again (this run's own last " \
           "restart), 200 steps to redo from the checkpoint at step 800" in d["eta_basis"]


def test_a_retrying_run_that_never_restarted_pays_the_machines_median(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    now = time.time()
    with sessions() as s:
        retrying_run(s, settings, now - 1000, restarted_before=True)  # another run's restart: 6 s
        run_id = retrying_run(s, settings, now, restarted_before=False)
        s.commit()
        d = queries.run_detail(s, run_id, now=now)
    assert d["eta_s"] == pytest.approx(10 + 6 + 120, abs=0.5)
    assert "~6 s to start again (the machine's median over 1 recent restart(s))" in d["eta_basis"]
