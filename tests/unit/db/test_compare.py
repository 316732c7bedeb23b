"""The Compare page's reads (db/compare.py) on a real SQLite database in tmp_path.

- final vs best: the value at the last lineage step against the minimum (loss-like) or the
  maximum (accuracy-like) of the per-step mean over ranks; NaN steps never win, an all-NaN
  final step is NaN;
- the lineage: what an attempt logged after a later attempt's resume step does not count;
- a run without the metric has no entry; a name no run logged is no error;
- two statements for the metrics and a fixed number for the runs, for 2 or 12 runs;
- the config diff lists exactly the flattened keys that differ.

    pytest tests/unit/db/test_compare.py
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from db.compare import (
    ABSENT,
    CompareError,
    compare_runs,
    config_diff,
    higher_is_better,
    metric_summaries,
    runs_list,
)
from db.metricstore import write_points
from db.models import Attempt, Run
from db.requests import create_run
from db.run_list import flatten
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings

NAN = float("nan")


def add_run(s: Session, settings: Settings, name: str, **train: Any) -> int:
    config = RunConfig.model_validate({"name": name, "train": {"max_steps": 100, **train}})
    run = create_run(s, config, settings.runs_dir, Price(usd_per_hour=3.6, unit="cpu-hour"))
    s.flush()
    for status in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED):
        assert transition(s, run.id, status, "test")
    return run.id


def add_attempt(s: Session, run_id: int, number: int, last_step: int, resume_step: int = 0,
                seconds: float = 100.0) -> None:
    end = time.time() - 10
    s.add(Attempt(run_id=run_id, number=number, status="SUCCEEDED", dir=f"/tmp/{run_id}/{number}",
                  started_at=end - seconds, ended_at=end, first_step_at=end - seconds + 1, last_step=last_step,
                  resume_step=resume_step))
    s.flush()


def points(s: Session, run_id: int, key: str, values: dict[tuple[int, int, int], float]) -> None:
    """``values``: {(attempt, step, rank): value} through rank 0's write path."""
    now = time.time()
    write_points(s.connection(), [dict(run_id=run_id, attempt=a, rank=r, step=step, key=key, value=v, wall_time=now)
                                  for (a, step, r), v in values.items()])


def test_which_way_is_best() -> None:
    assert [k for k in ("loss", "eval_loss", "eval_accuracy", "val/acc", "top1", "samples_per_s", "tokens_per_s",
                        "mfu", "step_time", "grad_norm", "lr", "mem_rss_mib", "error_rate", "train.f1",
                        "accumulate_steps") if higher_is_better(k)] == [
        "eval_accuracy", "val/acc", "top1", "samples_per_s", "tokens_per_s", "mfu", "train.f1"]


def test_final_and_best_are_the_rank_mean_min_for_loss_max_for_accuracy(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        run = add_run(s, settings, "a")
        add_attempt(s, run, 1, last_step=40)
        # Rank means per step: 10 -> 2.0, 20 -> 0.5 (the minimum, though rank 1 alone went lower
        # at step 30), 30 -> 0.6, 40 -> 0.9 (final).
        points(s, run, "loss", {(1, 10, 0): 1.5, (1, 10, 1): 2.5, (1, 20, 0): 0.4, (1, 20, 1): 0.6,
                                (1, 30, 0): 1.0, (1, 30, 1): 0.2, (1, 40, 0): 0.8, (1, 40, 1): 1.0})
        # Accuracy from rank 0 only: best is the maximum, final the last.
        points(s, run, "eval_accuracy", {(1, 20, 0): 0.7, (1, 30, 0): 0.9, (1, 40, 0): 0.85})
        s.commit()
        got = metric_summaries(s, [run], ["loss", "eval_accuracy"])
    loss, acc = got[(run, "loss")], got[(run, "eval_accuracy")]
    assert (loss.final, loss.final_step) == (pytest.approx(0.9), 40)
    assert (loss.best, loss.best_step, loss.higher_is_better, loss.points) == (pytest.approx(0.5), 20, False, 4)
    assert (acc.final, acc.final_step) == (pytest.approx(0.85), 40)
    assert (acc.best, acc.best_step, acc.higher_is_better, acc.points) == (pytest.approx(0.9), 30, True, 3)


def test_nan_never_wins_and_a_nan_final_step_is_nan(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        run = add_run(s, settings, "nan")
        add_attempt(s, run, 1, last_step=30)
        # Step 20: one rank NaN, the other 0.1 -> mean 0.1 (NaN skipped); step 30: all NaN.
        points(s, run, "loss", {(1, 10, 0): 1.0, (1, 10, 1): 1.0, (1, 20, 0): NAN, (1, 20, 1): 0.1,
                                (1, 30, 0): NAN, (1, 30, 1): NAN})
        only_nan = add_run(s, settings, "all-nan")
        add_attempt(s, only_nan, 1, last_step=10)
        points(s, only_nan, "loss", {(1, 10, 0): NAN})
        s.commit()
        got = metric_summaries(s, [run, only_nan], ["loss"])
    assert math.isnan(got[(run, "loss")].final) and got[(run, "loss")].final_step == 30
    assert (got[(run, "loss")].best, got[(run, "loss")].best_step) == (pytest.approx(0.1), 20)
    assert math.isnan(got[(only_nan, "loss")].final)
    assert (got[(only_nan, "loss")].best, got[(only_nan, "loss")].best_step) == (None, None)


def test_steps_abandoned_by_a_resume_do_not_count(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        run = add_run(s, settings, "resumed")
        # Attempt 1 got to step 40 (its best, 0.05, at step 40), then attempt 2 resumed from step 20
        # and ended at step 30: steps 30 and 40 of attempt 1 were abandoned.
        add_attempt(s, run, 1, last_step=40)
        add_attempt(s, run, 2, last_step=30, resume_step=20)
        points(s, run, "loss", {(1, 10, 0): 1.0, (1, 20, 0): 0.8, (1, 30, 0): 0.1, (1, 40, 0): 0.05,
                                (2, 30, 0): 0.7})
        s.commit()
        got = metric_summaries(s, [run], ["loss"])[(run, "loss")]
    assert (got.final, got.final_step) == (pytest.approx(0.7), 30)
    assert (got.best, got.best_step, got.points) == (pytest.approx(0.7), 30, 3)


def test_a_long_run_is_summarised_at_the_charts_resolution(settings: Settings,
                                                           sessions: sessionmaker[Session]) -> None:
    """More logged steps than ``max_points``: best is the best rank mean of a rollup bucket (what
    the chart draws), final still each rank's last value."""
    values = {(1, step, rank): 10.0 - step / 10 + rank + (3.0 if step % 7 == 0 else 0.0) + (step > 40) * 5.0
              for step in range(1, 49) for rank in (0, 1)}
    with sessions() as s:
        run = add_run(s, settings, "long")
        add_attempt(s, run, 1, last_step=48)
        points(s, run, "loss", values)
        s.commit()
        exact = metric_summaries(s, [run], ["loss"])[(run, "loss")]
        coarse = metric_summaries(s, [run], ["loss"], max_points=8)[(run, "loss")]
    per_step = {step: (values[(1, step, 0)] + values[(1, step, 1)]) / 2 for step in range(1, 49)}
    assert (exact.best, exact.best_step, exact.bucket_steps, exact.points) == (
        pytest.approx(min(per_step.values())), min(per_step, key=lambda k: per_step[k]), 1, 48)
    # 48 steps in at most 8 buckets a rank: buckets of 16 steps (level 2), 0-15, 16-31, 32-47, 48.
    buckets: dict[int, list[float]] = {}
    for step, value in per_step.items():
        buckets.setdefault(step // 16, []).append(value)
    means = {b * 16: sum(v) / len(v) for b, v in buckets.items()}
    assert (coarse.bucket_steps, coarse.points) == (16, 4)
    assert (coarse.best, coarse.best_step) == (pytest.approx(min(means.values())), min(means, key=lambda k: means[k]))
    assert coarse.best_step is not None and coarse.best_last_step == coarse.best_step + 15
    assert (coarse.final, coarse.final_step) == (pytest.approx(per_step[48]), 48)
    assert (exact.final, exact.final_step) == (pytest.approx(per_step[48]), 48)


def test_a_run_without_the_metric_has_no_entry(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        with_acc = add_run(s, settings, "with")
        add_attempt(s, with_acc, 1, last_step=10)
        points(s, with_acc, "eval_accuracy", {(1, 10, 0): 0.5})
        points(s, with_acc, "loss", {(1, 10, 0): 0.5})
        without = add_run(s, settings, "without")
        add_attempt(s, without, 1, last_step=10)
        points(s, without, "loss", {(1, 10, 0): 0.25})
        s.commit()
        got = metric_summaries(s, [with_acc, without], ["loss", "eval_accuracy", "never_logged"])
        assert metric_summaries(s, [with_acc], ["never_logged"]) == {}
        assert metric_summaries(s, [], ["loss"]) == {}
    assert sorted(got) == [(with_acc, "eval_accuracy"), (with_acc, "loss"), (without, "loss")]
    assert got[(without, "loss")].final == pytest.approx(0.25)


@pytest.fixture
def statements() -> Iterator[list[str]]:
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    yield sent
    event.remove(Engine, "before_cursor_execute", record)


def test_a_fixed_number_of_statements_for_2_or_12_runs(settings: Settings, sessions: sessionmaker[Session],
                                                       statements: list[str]) -> None:
    with sessions() as s:
        ids = []
        for i in range(12):
            run = add_run(s, settings, f"r{i}", lr=0.001 * (i + 1))
            add_attempt(s, run, 1, last_step=20)
            points(s, run, "loss", {(1, 10, 0): 1.0 + i, (1, 20, 0): 0.5 + i})
            ids.append(run)
        s.commit()
    counts = {}
    for n in (2, 12):
        with sessions() as s:
            start = len(statements)
            runs = compare_runs(s, ids[:n])
            summaries = metric_summaries(s, ids[:n], ["loss", "eval_accuracy"])
            counts[n] = len(statements) - start
        assert [r["id"] for r in runs] == ids[:n]
        assert [summaries[(i, "loss")].best for i in ids[:n]] == [0.5 + k for k in range(n)]
    assert counts[2] == counts[12], counts


def test_compare_runs_reads_the_summary_and_config_and_names_a_missing_id(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        run = add_run(s, settings, "one", lr=0.01)
        add_attempt(s, run, 1, last_step=100, seconds=100.0)
        s.commit()
        (got,) = compare_runs(s, [run])
        assert got["config"]["train"]["lr"] == 0.01
        assert got["step"] == 100 and got["status"] == "SUCCEEDED"
        assert got["cost_usd"] == pytest.approx(0.1)  # 100 s at $3.60 an hour
        largest = s.scalar(select(Run.id).order_by(Run.id.desc()))
        assert largest is not None
        with pytest.raises(CompareError, match=f"no run with id {largest + 1}"):
            compare_runs(s, [run, largest + 1])


def test_config_diff_lists_exactly_the_keys_that_differ() -> None:
    a = RunConfig.model_validate({"name": "a", "train": {"lr": 0.001}}).model_dump(mode="json", by_alias=True)
    b = RunConfig.model_validate({"name": "b", "train": {"lr": 0.01}, "tags": ["x"]}).model_dump(
        mode="json", by_alias=True)
    c = RunConfig.model_validate({"name": "c", "train": {"lr": 0.01, "batch_size": 32}}).model_dump(
        mode="json", by_alias=True)
    assert config_diff([a, b, c]) == [("tags", [[], ["x"], []]), ("train.batch_size", [64, 64, 32]),
                                      ("train.lr", [0.001, 0.01, 0.01])]
    assert config_diff([a, a]) == []
    assert config_diff([a]) == []
    assert config_diff([{"x": {"y": 1}}, {"x": {"z": 1}}]) == [("x.y", [1, ABSENT]), ("x.z", [ABSENT, 1])]
    assert flatten({"a": {"b": {"c": 1}, "d": {}}, "e": [1]}) == {"a.b.c": 1, "a.d": {}, "e": [1]}


def test_a_forks_best_loss_is_along_its_lineage_its_parents_steps_included(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """The Runs list's best loss of a fork: its parent's up to the fork's step, lower than its own
    or before it has any (issue 56, item 2); the parent's later steps are not the fork's."""
    with sessions() as s:
        parent = add_run(s, settings, "parent")
        add_attempt(s, parent, 1, last_step=40)
        points(s, parent, "loss", {(1, 10, 0): 2.0, (1, 20, 0): 0.5, (1, 30, 0): 0.1})
        early, late = (add_run(s, settings, name) for name in ("early", "late"))
        s.get_one(Run, early).parent_run_id = s.get_one(Run, late).parent_run_id = parent
        s.get_one(Run, early).parent_step, s.get_one(Run, late).parent_step = 10, 20
        add_attempt(s, early, 1, last_step=15, resume_step=10)
        points(s, early, "loss", {(1, 15, 0): 1.5})  # its own, lower than the parent's up to step 10
        s.commit()
        listed = {r["name"]: r["best_loss"] for r in runs_list(s)}
    assert listed == {"parent": pytest.approx(0.1), "early": pytest.approx(1.5), "late": pytest.approx(0.5)}
