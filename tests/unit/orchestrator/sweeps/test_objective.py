"""A trial's objective read from the metric store: the value at the largest step logged at or
before the step asked, rank 0's or the mean over ranks, the newest attempt's where a retry trained
that step again; the first verified checkpoint at or past a rung; the metrics each built-in
workload records."""

from __future__ import annotations

import math

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import metricstore
from db.models import Checkpoint
from db.requests import create_run
from db.vocabulary.config import RunConfig, parse_config
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.sweeps.objective import checkpoint_at_or_past, metric_problems, newest_logged, value_at


def _run(sessions: sessionmaker[Session], settings: Settings) -> int:
    with sessions() as s:
        run = create_run(s, RunConfig(name="t"), settings.runs_dir, Price(0.1, "test"))
        points = [(1, 10, {0: 0.9, 1: 1.1}), (1, 20, {0: 0.5, 1: 0.7}), (1, 30, {0: 0.4, 1: 0.6}),
                  (2, 30, {0: 0.45, 1: 0.65}), (2, 40, {0: math.nan, 1: 0.2})]  # attempt 2 resumed from 20
        metricstore.write_points(s.connection(), [
            {"run_id": run.id, "attempt": a, "rank": r, "step": step, "key": "loss", "value": v, "wall_time": 1.0}
            for a, step, by_rank in points for r, v in by_rank.items()])
        checkpoints = ((10, True, None), (20, False, None), (25, True, "not its own"), (30, True, None))
        for step, verified, refused in checkpoints:
            s.add(Checkpoint(run_id=run.id, attempt=1, step=step, path="/x", bytes=1, sha256="s", params_digest="p",
                             blocked_s=0, total_s=0, created_at=1.0, verified=verified, refused_reason=refused))
        s.commit()
        return run.id


def test_the_value_at_a_step_rank_0_or_the_mean(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = _run(sessions, settings)
    with sessions() as s:
        assert value_at(s, run_id, "loss", 25, "rank0") == (20, 0.5)  # the largest step logged at or before
        assert value_at(s, run_id, "loss", 25, "mean") == (20, pytest.approx(0.6))
        assert value_at(s, run_id, "loss", 30, "rank0") == (30, 0.45)  # the newest attempt that logged 30
        assert value_at(s, run_id, "loss", 5, "rank0") is None  # nothing logged yet
        assert value_at(s, run_id, "nope", 50, "rank0") is None
        step, nan = value_at(s, run_id, "loss", math.inf, "rank0") or (0, 0.0)
        assert step == 40 and math.isnan(nan)  # a NaN stays NaN (it ranks last)
        assert newest_logged(s, run_id, "loss") == 40 and newest_logged(s, run_id, "nope") is None
        # A rung at 12 counts at the first verified checkpoint of the run's own at or past it: 30.
        assert [checkpoint_at_or_past(s, run_id, step) for step in (5, 10, 12, 31)] == [10, 10, 30, None]


@pytest.mark.parametrize(("config", "sweep", "expected"), [
    ({}, {"metric": "eval_accuracy"}, None),
    ({}, {"metric": "epoch"}, None),  # mlp-digits' own
    ({}, {"metric": "tokens_per_s"}, "sweep.metric = 'tokens_per_s': the mlp-digits workload never records it"),
    ({"workload": {"kind": "gpt-char"}}, {"metric": "tokens_per_s"}, None),
    ({"workload": {"kind": "script", "script": "x.py"}}, {"metric": "val/bpb"}, None),  # a script's are its own
    ({"train": {"log_every": 50}}, {"metric": "loss", "early_stop": {"min_steps": 20}},
     "sweep.metric = 'loss' is recorded first at step 50 (train.log_every = 50): no value by the first rung"),
    ({"train": {"eval_every": 0}}, {"metric": "eval_loss", "early_stop": {"min_steps": 100}},
     "sweep.metric = 'eval_loss' is recorded only at the last step (train.eval_every = 0)"),
])
def test_a_metric_the_workload_does_not_record_in_time_is_refused(config: dict, sweep: dict,
                                                                  expected: str | None) -> None:
    parsed = parse_config({**config, "sweep": {"space": {"train.seed": {"int": [0, 3]}}, **sweep}})
    assert parsed.sweep is not None
    rungs = [parsed.sweep.early_stop.min_steps] if parsed.sweep.early_stop is not None else []
    problems = metric_problems(parsed.base(), parsed.sweep, rungs)
    assert len(problems) == (expected is not None)
    assert expected is None or problems[0].startswith(expected)
