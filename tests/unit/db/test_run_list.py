"""The Runs list (db/run_list.py) on a real SQLite and PostgreSQL database: the same few
statements for 1, 10 and 100 runs, exactly what the per-run computation it replaced returns, and
an ETA from the metric a run reports; its search, filters and sorting by summary metrics (issue
29, items 7 and 8: the search is SQL LIKE first, and case and escaping differ between the two).
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from bench.bench_runs_list import seed_runs
from db import metricstore, queries, run_list
from db.compare import runs_list
from db.metricstore import write_points
from db.models import Attempt, Event, Run
from db.requests import create_run
from db.run_list import RunFilter, list_runs, run_tags
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from db.vocabulary.settings_file import write_values
from orchestrator.run_edits import EditRefused, edit_run, set_archived, set_starred
from tests.unit.db.statements import counted, reference_summary, statements
from tests.unit.db.workspace_runs import add_losses, names_of, workspace_run

__all__ = ["statements"]  # the fixtures, from the helper module


pytestmark = pytest.mark.both_dbs


# --- list_runs ------------------------------------------------------------------------------------


def test_list_runs_sends_the_same_statements_for_1_10_and_100_runs(
        settings: Settings, sessions: sessionmaker[Session], statements: list[tuple[Engine, str]]) -> None:
    per_size = {}
    for total in (1, 10, 100):
        with sessions() as s:
            seed_runs(s, settings.runs_dir, total - sum(1 for _ in s.scalars(select(Run.id))))
            s.commit()
        runs, sent = counted(sessions, statements, run_list.list_runs)
        assert len(runs) == total
        per_size[total] = sent
    # runs; their attempts; their checkpoint times; the name id of "loss"; the live runs' newest points;
    # which of them are a sweep's trials; their attempts' energy; from 10 runs on, a live run
    # (retrying) has no loss points: the metrics it has, in one more; the machine's newest
    # restarts (the start-up a retrying run is about to pay), in one more; and a run is queued: the
    # queue, for its start estimate (no scheduler has said what this machine has, so no more:
    # test_queue_starts counts the rest).
    assert [len(sent) for sent in per_size.values()] == [7, 10, 10]
    assert all(sum("FROM metric_points" in sql for sql in sent) == 1 for sent in per_size.values())


def test_list_runs_equals_the_per_run_computation(settings: Settings, sessions: sessionmaker[Session]) -> None:
    now = time.time()
    # Your cost too, with a tariff and a hardware price: both lines of every run, bit for bit.
    write_values(settings.home, {("cost", "electricity_usd_per_kwh"): 0.3, ("cost", "hardware_usd_per_gpu"): 9000.0})
    with sessions() as s:
        seed_runs(s, settings.runs_dir, 40, now=now - 5)
        s.commit()
    with sessions() as s:
        got = run_list.list_runs(s, now=now)
        runs = s.scalars(select(Run).order_by(Run.id.desc())).all()
        expected = [reference_summary(s, r, now) for r in runs]
        running = run_list.list_runs(s, ["RUNNING", "RETRYING"], limit=7, now=now)
    assert len(got) == 40 and got == expected  # every field of every run, floats bit for bit
    assert running == [e for e in expected if e["status"] in ("RUNNING", "RETRYING")][:7]
    # The seeded mix reaches every branch: ETAs from points, none without points, 0 at success;
    # money wasted by failures; runs without attempts.
    etas = [e["eta_s"] for e in expected]
    assert any(eta not in (None, 0.0) for eta in etas) and None in etas and 0.0 in etas
    assert any(e["cost_wasted_usd"] > 0 for e in expected) and any(e["attempt_count"] == 0 for e in expected)
    assert any(e["attempt_count"] == 2 for e in expected)
    assert any(e["cost"]["yours"]["wasted_usd"] > 0 for e in expected)  # the wasted part of yours, too


def test_the_eta_of_a_run_without_loss_comes_from_the_metric_it_reports(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """A script that calls its metrics train/loss (every step) and val/loss (every 50): the Runs
    list and the Run page project from train/loss, the metric that got furthest and most often."""
    now = time.time()
    with sessions() as s:
        run = create_run(s, RunConfig.model_validate({"name": "hf", "train": {"max_steps": 1000}}),
                         settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        for status in ("STARTING", "RUNNING"):
            transition(s, run.id, RunStatus(status), "t")
        s.add(Attempt(run_id=run.id, number=1, status="RUNNING", dir="/tmp/a", started_at=now - 300,
                      first_step_at=now - 290, progress_at=now, last_step=200))
        points = [{"run_id": run.id, "attempt": 1, "rank": 0, "step": step, "key": "train/loss", "value": 1.0,
                   "wall_time": now - 200 + step * 0.5} for step in range(1, 201)]
        points += [{"run_id": run.id, "attempt": 1, "rank": 0, "step": step, "key": "val/loss", "value": 2.0,
                    "wall_time": now - 200 + step * 0.5} for step in range(50, 201, 50)]
        metricstore.write_points(s.connection(), points)
        s.commit()
        assert metricstore.progress_key(s, run.id, 1) == "train/loss"
        listed = next(r for r in run_list.list_runs(s) if r["id"] == run.id)
        detail = queries.run_detail(s, run.id)
    # 800 steps to go at 0.5 s a step.
    assert listed["eta_s"] == detail["eta_s"] == pytest.approx(400, rel=0.05)


def test_search_narrows_by_name_tag_note_and_config_value_never_by_a_key(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        workspace_run(s, settings, "gpt-small", tags=("baseline",))
        workspace_run(s, settings, "GPT_large", tags=("sweep-7",), lr=0.0003)
        digits = workspace_run(s, settings, "digits", lr=0.0003)
        edit_run(s, digits, note="try 100% warmup")
        s.commit()
        def found(search: str) -> list[str]:
            return sorted(names_of(list_runs(s, where=RunFilter(search=search))))

        assert found("gpt") == ["GPT_large", "gpt-small"]  # any case
        assert found("gpt small") == ["gpt-small"]  # every word must match
        assert found("sweep") == ["GPT_large"]  # a tag
        assert found("100%") == ["digits"]  # the note; % is no wildcard
        assert found("T_L") == ["GPT_large"]  # _ is no wildcard
        assert found("train.lr=0.0003") == ["GPT_large", "digits"]  # a config value, by its key
        assert found("lr=3e-4") == ["GPT_large", "digits"]  # the key's last part, the value as a number
        assert found("max_steps") == []  # a key is not a value
        assert found("nothing-like-this") == []


def test_status_tag_star_and_archive_filters(sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        done = workspace_run(s, settings, "done", tags=("a",))
        live = workspace_run(s, settings, "live", tags=("b",), ends=RunStatus.RUNNING)
        old = workspace_run(s, settings, "old")
        assert set_starred(s, done, True, who="test") == f"run {done} starred"
        assert "hidden from the list" in set_archived(s, old, True, who="test")
        with pytest.raises(EditRefused, match=f"run {live} is RUNNING: only a finished run can be archived"):
            set_archived(s, live, True)
        s.commit()
        assert names_of(list_runs(s)) == ["live", "done"]  # archived hidden, newest first
        assert names_of(list_runs(s, where=RunFilter(archived=True))) == ["old", "live", "done"]
        assert names_of(list_runs(s, where=RunFilter(starred=True))) == ["done"]
        assert names_of(list_runs(s, where=RunFilter(statuses=("RUNNING",)))) == ["live"]
        assert names_of(list_runs(s, where=RunFilter(tags=("b",)))) == ["live"]
        assert run_tags(s) == ["a", "b"]
        assert list_runs(s, where=RunFilter(starred=True))[0]["starred"] is True
        events = s.scalars(select(Event.message).where(Event.kind == "edit").order_by(Event.id)).all()
        assert events == ["starred by test", "archived by test"]


def test_sort_by_best_loss_and_headline_metric_puts_runs_without_one_last(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        high = workspace_run(s, settings, "high")
        low = workspace_run(s, settings, "low")
        workspace_run(s, settings, "none")
        add_losses(s, high, [3.0, 2.0, 2.5])
        add_losses(s, low, [3.0, 0.5, 0.7])
        write_points(s.connection(), [{"run_id": high, "attempt": 1, "rank": 0, "step": 3, "key": "eval_accuracy",
                                       "value": 0.9, "wall_time": 4.0}])
        s.commit()
        runs = runs_list(s, sort="best_loss", descending=False)
        assert names_of(runs) == ["low", "high", "none"]
        assert [r["best_loss"] for r in runs] == [0.5, 2.0, None]
        assert names_of(runs_list(s, sort="best_loss", descending=True)) == ["high", "low", "none"]
        by_headline = runs_list(s, sort="headline")
        assert (by_headline[0]["name"], by_headline[0]["headline_key"], by_headline[0]["headline_value"]) == (
            "high", "eval_accuracy", 0.9)
        assert names_of(list_runs(s, sort="name", descending=False)) == ["high", "low", "none"]
        with pytest.raises(ValueError, match="sort 'loss': use one of id, name"):
            list_runs(s, sort="loss")


def test_run_configs_reads_each_runs_config_flattened_in_one_statement(
        sessions: sessionmaker[Session], settings: Settings, statements: list[tuple[Engine, str]]) -> None:
    with sessions() as s:
        a = workspace_run(s, settings, "a", lr=0.01)
        b = workspace_run(s, settings, "b", tags=("x",))
        s.commit()
    configs, sent = counted(sessions, statements, lambda s: run_list.run_configs(s, [a, b, 999]))
    assert len([sql for sql in sent if sql.lstrip().upper().startswith("SELECT")]) == 1
    assert sorted(configs) == [a, b]  # no run 999: left out
    assert (configs[a]["train.lr"], configs[b]["train.lr"]) == (0.01, 0.001)
    assert configs[b]["tags"] == ["x"] and configs[a]["name"] == "a"
    with sessions() as s:
        assert run_list.run_configs(s, []) == {}
        assert list(run_list.run_configs(s, limit=1)) == [b]  # without ids: the newest runs
