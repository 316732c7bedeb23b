"""How an ended attempt ends its run (orchestrator/scheduler/outcomes.py): the ``ENDINGS`` table,
one row a rule and without a database, then ``settle`` on a real database: an agent killed from
outside, a preemption, a cancel or a pause that meets the run's end. And an attempt's config
(``attempt_config``): the run's stored config plus the attempt's overrides, validated as the
stored config it is, so that a run stored before a rule was tightened (issue 52's tag rule) is
still retried with half its micro-batch after a CUDA out-of-memory, not refused by that rule."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Run
from db.requests import create_run
from db.states import RunStatus, StopReason
from db.vocabulary.causes import Cause
from db.vocabulary.config import RunConfig, config_from_json, parse_config
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.scheduler.outcomes import APPLIERS, ENDINGS, Ended, Ending, attempt_config, ending, settle
from tests.unit.orchestrator.fake_runs import attempts, make_scheduler, queue, status, tick_until

# -- how an ended attempt ends its run: the decision table, without a database ------------------

CANCEL, PAUSE, HANG, PRUNE = StopReason.CANCEL, StopReason.PAUSE, StopReason.HANG, StopReason.PRUNE


def ended(status: RunStatus = RunStatus.RUNNING, stop: StopReason | None = None, code: int | None = 1,
          exited: bool = True, stopped: bool = False, every_step: bool = False, crash: str | None = None,
          by: str | None = None, mode: StopReason | None = None) -> Ended:
    """What is known once the processes are gone; ``mode`` defaults as stop_mode() reads it."""
    mode = mode or (PAUSE if status is RunStatus.PAUSING or stop is PAUSE else CANCEL)
    return Ended(status, stop, mode, code, exited, stopped, every_step, crash, by)


ENDING_ROWS = [
    # (what happened, the facts, how the run ends)
    ("every step trained before the cancel took effect", ended(RunStatus.CANCELLING, CANCEL, 0, every_step=True),
     Ending.FINISHED_BEFORE_STOP),
    ("every step trained before the pause took effect", ended(RunStatus.PAUSING, PAUSE, 0, every_step=True),
     Ending.FINISHED_BEFORE_STOP),
    ("a pause with a checkpoint", ended(RunStatus.PAUSING, PAUSE, 0, stopped=True), Ending.PAUSED),
    ("a pause whose ranks had not trained every step", ended(RunStatus.PAUSING, PAUSE, 0), Ending.PAUSED),
    # A sweep's prune is a pause that ends PRUNED (never FAILED or CANCELLED), unless every step was trained.
    ("a prune with a checkpoint", ended(RunStatus.PAUSING, PRUNE, 0, stopped=True, mode=PRUNE), Ending.PRUNED),
    ("a prune whose agent answered the SIGTERM with 1", ended(RunStatus.PAUSING, PRUNE, 1, stopped=True, mode=PRUNE),
     Ending.PRUNED),
    ("a prune after every step was trained", ended(RunStatus.PAUSING, PRUNE, 0, every_step=True, mode=PRUNE),
     Ending.FINISHED_BEFORE_STOP),
    ("a failure while pruning", ended(RunStatus.PAUSING, code=1, exited=True, mode=PRUNE),
     Ending.FAILED_WHILE_PAUSING),
    ("a cancel answered by torchrun's own non-zero exit", ended(RunStatus.CANCELLING, CANCEL, 1, stopped=True),
     Ending.CANCELLED),
    ("a cancel asked for while pausing", ended(RunStatus.CANCELLING, PAUSE, 0, stopped=True, mode=CANCEL),
     Ending.CANCELLED),
    ("a run being cancelled whose launcher left no record", ended(RunStatus.CANCELLING, None, None, exited=False),
     Ending.CANCELLED),
    ("a run being paused whose launcher left no record", ended(RunStatus.PAUSING, None, None, exited=False),
     Ending.PAUSED),
    ("every rank exited 0", ended(code=0), Ending.SUCCEEDED),
    ("every rank finished, then one died in shutdown", ended(code=-6, crash="rank 1 by SIGABRT"), Ending.SUCCEEDED),
    ("a hang killed by runyard is a failure", ended(stop=HANG, code=-9), Ending.FAILED),
    ("exit 0 after a SIGTERM from outside is a preemption", ended(code=0, stopped=True), Ending.FAILED),
    ("a person's scancel", ended(code=143, by="Slurm job 7 was cancelled with scancel"), Ending.CANCELLED_OUTSIDE),
    ("a person's scancel after the ranks finished", ended(code=0, by="Slurm job 7 ended CANCELLED"), Ending.SUCCEEDED),
    ("a failure while pausing", ended(RunStatus.PAUSING, code=1), Ending.FAILED_WHILE_PAUSING),
    ("a failure while cancelling", ended(RunStatus.CANCELLING, code=1), Ending.FAILED_WHILE_CANCELLING),
    ("a failure", ended(code=1), Ending.FAILED),
    ("a launcher that vanished", ended(code=None, exited=False), Ending.FAILED),
]


@pytest.mark.parametrize(("name", "facts", "expected"), ENDING_ROWS, ids=[row[0] for row in ENDING_ROWS])
def test_how_an_ended_attempt_ends_its_run(name: str, facts: Ended, expected: Ending) -> None:
    assert ending(facts) is expected


def test_every_ending_has_a_rule_and_is_applied() -> None:
    assert [e for e, _ in ENDINGS] == list(Ending)  # the table in the enum's order, each once
    assert set(APPLIERS) == set(Ending)
    assert {row[2] for row in ENDING_ROWS} == set(Ending)  # and every one has a row above


# -- an agent killed from outside --------------------------------------------------------------


def ended_attempt(sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, code: int,
                  stopped: bool) -> tuple[int, int]:
    with sessions() as s:
        run = create_run(s, RunConfig.model_validate({"name": "agent", "retry": {"max_retries": 3}}), settings.runs_dir,
                         Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.flush()
        run.status = RunStatus.RUNNING.value
        attempt_dir = tmp_path / f"attempt-{code}"
        attempt_dir.mkdir()
        (attempt_dir / "exit.json").write_text(json.dumps({"exit_code": code, "pid": 4242, "started_at": 1.0,
                                                           "ended_at": 2.0}))
        if stopped:  # the ranks got a SIGTERM and checkpointed before they died
            (attempt_dir / "stopped.json").write_text(json.dumps({"step": 50, "checkpoint_step": 50}))
        attempt = Attempt(run_id=run.id, number=1, status="RUNNING", dir=str(attempt_dir), started_at=0.0,
                          first_step_at=0.5, last_step=50)
        s.add(attempt)
        s.commit()
        return run.id, attempt.id


def settle_it(sessions: sessionmaker[Session], ids: tuple[int, int]) -> tuple[Attempt, Run]:
    run_id, attempt_id = ids
    with sessions() as s:
        run, attempt = s.get_one(Run, run_id), s.get_one(Attempt, attempt_id)
        settle(s, run, attempt, json.loads((Path(attempt.dir) / "exit.json").read_text()))
        s.commit()
        s.expunge_all()
        return attempt, run


def test_an_agent_killed_from_outside_spends_a_retry_even_if_its_ranks_checkpointed(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path
) -> None:
    attempt, run = settle_it(sessions, ended_attempt(sessions, settings, tmp_path, code=-9, stopped=True))
    assert attempt.cause == "SIGNAL" and attempt.retry_counted is True
    assert attempt.exception == "the torchrun agent (pid 4242) was killed by SIGKILL"
    assert run.status == "RETRYING" and run.retries_used == 1


def test_a_preemption_the_agent_survived_is_still_free(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path
) -> None:
    # SIGTERM from outside: torchrun stops its ranks, which checkpoint, and exits on its own (1).
    attempt, run = settle_it(sessions, ended_attempt(sessions, settings, tmp_path, code=1, stopped=True))
    assert attempt.cause == "PREEMPTED" and attempt.retry_counted is False
    assert run.status == "RETRYING" and run.retries_used == 0


@pytest.mark.parametrize("asked", ["cancel", "pause"])
def test_a_cancel_that_arrives_as_the_run_finishes_leaves_it_succeeded(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, asked: str
) -> None:
    """Step 50 of 50 done, the final save under way, then Cancel (or Pause): the ranks end on
    their own with 0 and no stop record. A finished run must not read CANCELLED at 50/50."""
    ids = ended_attempt(sessions, settings, tmp_path, code=0, stopped=False)
    with sessions() as s:
        run = s.get_one(Run, ids[0])
        stopping = RunStatus.PAUSING if asked == "pause" else RunStatus.CANCELLING
        run.max_steps, run.status, run.stop_mode = 50, stopping.value, asked
        s.get_one(Attempt, ids[1]).stop_reason = asked
        s.commit()
    attempt, run = settle_it(sessions, ids)
    assert (run.status, attempt.status) == ("SUCCEEDED", "SUCCEEDED")
    assert run.status_reason == f"all ranks finished (step 50/50) before the {asked} took effect"


def test_a_cancel_that_stops_the_ranks_before_the_last_step_cancels(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path
) -> None:
    ids = ended_attempt(sessions, settings, tmp_path, code=0, stopped=True)  # stopped at 50 with a checkpoint
    with sessions() as s:
        run = s.get_one(Run, ids[0])
        run.max_steps, run.status, run.stop_mode = 300, RunStatus.CANCELLING.value, "cancel"
        s.get_one(Attempt, ids[1]).stop_reason = "cancel"
        s.commit()
    attempt, run = settle_it(sessions, ids)
    assert (run.status, attempt.status) == ("CANCELLED", "CANCELLED")
    assert (run.status_reason or "").startswith("cancelled at step 50 (with a checkpoint)")


@pytest.mark.parametrize(("status", "stop_mode", "ends"), [
    ("PAUSING", "pause", "PAUSED"),  # a pause carried out
    ("CANCELLING", "cancel", "CANCELLED"),  # a Cancel clicked while it was PAUSING: the SIGTERM went as a pause
])
def test_a_stopped_attempt_ends_the_run_as_the_last_request_says(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, status: str, stop_mode: str, ends: str
) -> None:
    ids = ended_attempt(sessions, settings, tmp_path, code=0, stopped=True)  # stopped at 50 with a checkpoint
    with sessions() as s:
        run = s.get_one(Run, ids[0])
        run.max_steps, run.status, run.stop_mode = 300, status, stop_mode
        s.get_one(Attempt, ids[1]).stop_reason = "pause"
        s.commit()
    attempt, run = settle_it(sessions, ids)
    assert (run.status, attempt.status) == (ends, ends)
    assert (run.status_reason or "").startswith(f"{ends.lower()} at step 50 (with a checkpoint)")


def test_a_clean_pause_is_not_shown_as_torchruns_exit_1(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path
) -> None:
    """The ranks checkpointed on runyard's SIGTERM (stopped.json) and stopped; torchrun's agent got
    the SIGTERM too and exited 1. The attempt is PAUSED with exit code 0, the 1 explained."""
    ids = ended_attempt(sessions, settings, tmp_path, code=1, stopped=True)
    with sessions() as s:
        attempt = s.get_one(Attempt, ids[1])
        attempt.stop_reason, attempt.signal_sent = "pause", "SIGTERM"
        s.get_one(Run, ids[0]).status = "CANCELLING"  # what request_cancel(mode="pause") left
        s.commit()
    attempt, run = settle_it(sessions, ids)
    assert (attempt.status, attempt.exit_code, run.status) == ("PAUSED", 0, "PAUSED")
    assert ("(with a checkpoint; the ranks stopped cleanly; the launcher's own exit code 1 is how torchrun ends "
            "when it is sent SIGTERM, not a failure)") in (attempt.reason or "")


OLD_TAG = "before the rule"  # a space: refused since issue 52, stored by runs submitted before it


def stored_before_the_tag_rule(config_json: str) -> str:
    """``config_json`` as runyard stored it before the tag rule, with a tag the rule now refuses."""
    stored = json.loads(config_json)
    stored["tags"] = [OLD_TAG]
    return json.dumps(stored)


def test_a_stored_config_with_a_tag_the_rule_now_refuses_takes_an_attempts_overrides() -> None:
    text = stored_before_the_tag_rule(parse_config({"train": {"batch_size": 32, "grad_accum": 1}}).to_json())
    assert config_from_json(text).tags == (OLD_TAG,)  # it opens as stored
    run = SimpleNamespace(config_json=text)
    halved = SimpleNamespace(overrides_json=json.dumps({"train": {"batch_size": 16, "grad_accum": 2}}))
    config = attempt_config(run, halved)  # type: ignore[arg-type]
    assert (config.train.batch_size, config.train.grad_accum, config.tags) == (16, 2, (OLD_TAG,))


def test_a_run_stored_before_the_tag_rule_is_retried_with_half_its_micro_batch_after_a_cuda_oom(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = queue(sessions, settings, "fails", retry={"max_retries": 1, "backoff_s": 600.0, "backoff_max_s": 600.0})
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, run_id) == "RETRYING")
    with sessions() as s:  # the run as stored before the rule, its first attempt out of CUDA memory
        run = s.get_one(Run, run_id)
        run.config_json = stored_before_the_tag_rule(run.config_json)
        run.retry_at = time.time()
        first = s.scalars(select(Attempt).where(Attempt.run_id == run_id)).one()
        first.cause = Cause.CUDA_OOM.value
        s.commit()
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)
    second = attempts(sessions, run_id)[1]
    assert json.loads(second.overrides_json) == {"train": {"batch_size": 32, "grad_accum": 2}}
    ran_with = json.loads((Path(second.dir) / "config.json").read_text())  # what its ranks read
    assert (ran_with["train"]["batch_size"], ran_with["train"]["grad_accum"], ran_with["tags"]) == (32, 2, [OLD_TAG])
    tick_until(scheduler, lambda: status(sessions, run_id) == "FAILED")
