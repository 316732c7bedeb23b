"""An attempt's config (orchestrator/scheduler/outcomes.py's ``attempt_config``): the run's stored
config plus the attempt's overrides, validated as the stored config it is. A run stored before a
rule was tightened (issue 52's tag rule: no spaces) still opens, and must still be retried with
half its micro-batch after a CUDA out-of-memory, not refused by the rule it predates."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Run
from db.vocabulary.causes import Cause
from db.vocabulary.config import config_from_json, parse_config
from db.vocabulary.settings import Settings
from orchestrator.scheduler.outcomes import attempt_config
from tests.unit.orchestrator.fake_runs import attempts, make_scheduler, queue, status, tick_until

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
        run = s.get(Run, run_id)
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
