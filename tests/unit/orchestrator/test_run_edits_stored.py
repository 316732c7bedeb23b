"""The Runs list as a workspace and a run's metadata after submit (issue 29, items 7 and 8):
search, filters, sorting by summary metrics, star, archive, delete, rename, tags and note, on
SQLite and PostgreSQL (the search is SQL LIKE first: case and escaping differ between them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.compare import runs_list
from db.metricstore import write_points
from db.models import Attempt, Checkpoint, Event, Run
from db.queries import run_detail
from db.requests import create_run, request_resume
from db.run_list import RunFilter, list_runs, run_tags
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.run_edits import EditRefused, delete_run, deletion_plan, edit_run, set_archived, set_starred

pytestmark = pytest.mark.both_dbs


def _run(s: Session, settings: Settings, name: str, *, tags: tuple[str, ...] = (), lr: float = 0.001,
         ends: RunStatus | None = RunStatus.SUCCEEDED) -> int:
    config = RunConfig.model_validate({"name": name, "tags": list(tags), "train": {"lr": lr, "max_steps": 100}})
    run = create_run(s, config, settings.runs_dir, Price(1.0, "cpu-hour"))
    s.flush()
    path = {None: [], RunStatus.RUNNING: [RunStatus.STARTING, RunStatus.RUNNING],
            RunStatus.SUCCEEDED: [RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED]}[ends]
    for status in path:
        assert transition(s, run.id, status, "test")
    return run.id


def _losses(s: Session, run_id: int, values: list[float], key: str = "loss") -> None:
    s.add(Attempt(run_id=run_id, number=1, status="SUCCEEDED", dir="/nowhere", started_at=1.0, last_step=len(values)))
    s.flush()
    write_points(s.connection(), [{"run_id": run_id, "attempt": 1, "rank": 0, "step": i + 1, "key": key,
                                   "value": v, "wall_time": 1.0 + i} for i, v in enumerate(values)])


def _names(runs: list[dict[str, Any]]) -> list[str]:
    return [r["name"] for r in runs]


def test_search_narrows_by_name_tag_note_and_config_value_never_by_a_key(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        _run(s, settings, "gpt-small", tags=("baseline",))
        _run(s, settings, "GPT_large", tags=("sweep-7",), lr=0.0003)
        digits = _run(s, settings, "digits", lr=0.0003)
        edit_run(s, digits, note="try 100% warmup")
        s.commit()
        def found(search: str) -> list[str]:
            return sorted(_names(list_runs(s, where=RunFilter(search=search))))

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
        done = _run(s, settings, "done", tags=("a",))
        live = _run(s, settings, "live", tags=("b",), ends=RunStatus.RUNNING)
        old = _run(s, settings, "old")
        assert set_starred(s, done, True, who="test") == f"run {done} starred"
        assert "hidden from the list" in set_archived(s, old, True, who="test")
        with pytest.raises(EditRefused, match=f"run {live} is RUNNING: only a finished run can be archived"):
            set_archived(s, live, True)
        s.commit()
        assert _names(list_runs(s)) == ["live", "done"]  # archived hidden, newest first
        assert _names(list_runs(s, where=RunFilter(archived=True))) == ["old", "live", "done"]
        assert _names(list_runs(s, where=RunFilter(starred=True))) == ["done"]
        assert _names(list_runs(s, where=RunFilter(statuses=("RUNNING",)))) == ["live"]
        assert _names(list_runs(s, where=RunFilter(tags=("b",)))) == ["live"]
        assert run_tags(s) == ["a", "b"]
        assert list_runs(s, where=RunFilter(starred=True))[0]["starred"] is True
        events = s.scalars(select(Event.message).where(Event.kind == "edit").order_by(Event.id)).all()
        assert events == ["starred by test", "archived by test"]


def test_sort_by_best_loss_and_headline_metric_puts_runs_without_one_last(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        high = _run(s, settings, "high")
        low = _run(s, settings, "low")
        _run(s, settings, "none")
        _losses(s, high, [3.0, 2.0, 2.5])
        _losses(s, low, [3.0, 0.5, 0.7])
        write_points(s.connection(), [{"run_id": high, "attempt": 1, "rank": 0, "step": 3, "key": "eval_accuracy",
                                       "value": 0.9, "wall_time": 4.0}])
        s.commit()
        runs = runs_list(s, sort="best_loss", descending=False)
        assert _names(runs) == ["low", "high", "none"]
        assert [r["best_loss"] for r in runs] == [0.5, 2.0, None]
        assert _names(runs_list(s, sort="best_loss", descending=True)) == ["high", "low", "none"]
        by_headline = runs_list(s, sort="headline")
        assert (by_headline[0]["name"], by_headline[0]["headline_key"], by_headline[0]["headline_value"]) == (
            "high", "eval_accuracy", 0.9)
        assert _names(list_runs(s, sort="name", descending=False)) == ["high", "low", "none"]
        with pytest.raises(ValueError, match="sort 'loss': use one of id, name"):
            list_runs(s, sort="loss")


def test_edit_renames_tags_and_notes_a_run_with_one_event_per_change(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        run_id = _run(s, settings, "first", tags=("keep", "drop"))
        done = edit_run(s, run_id, name="second", add_tags=["new:1"], remove_tags=["drop"], note="  lr too high  ",
                        who="cli")
        s.commit()
        assert done == ["renamed 'first' to 'second'", "tag 'drop' removed", "tag 'new:1' added",
                        "note set: 'lr too high'"]
        detail = run_detail(s, run_id)
        assert (detail["name"], detail["tags"], detail["note"]) == ("second", ["keep", "new:1"], "lr too high")
        edits = [e["message"] for e in reversed(detail["events"]) if e["kind"] == "edit"]  # newest first there
        assert edits == [f"{d} by cli" for d in done]
        assert edit_run(s, run_id, name="second", add_tags=["keep"]) == []  # nothing new: no event
        assert edit_run(s, run_id, note="") == ["note cleared"]
        assert json.loads(s.get(Run, run_id).config_json)["name"] == "first"  # the config stays as submitted


def test_edit_reports_every_problem_together_and_changes_nothing(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        run_id = _run(s, settings, "ok", tags=("a",))
        s.commit()
        with pytest.raises(EditRefused) as refused:
            edit_run(s, run_id, name="has space", add_tags=["fine", "bad,tag", ""], remove_tags=["zzz"],
                     note="x" * 5000)
        message = str(refused.value)
        for part in ("name 'has space': use letters, digits", "tag 'bad,tag': use letters", "tag '': use",
                     "remove tag 'zzz': run", "has no such tag (its tags: a)", "note: 5000 characters; at most 4000"):
            assert part in message, (part, message)
        s.rollback()
        run = s.get(Run, run_id)
        assert (run.name, run.tags_json, run.note) == ("ok", '["a"]', None)


def test_delete_is_refused_while_active_names_pinned_checkpoints_and_removes_the_folder(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        live = _run(s, settings, "live", ends=RunStatus.RUNNING)
        done = _run(s, settings, "done")
        _losses(s, done, [1.0, 0.5])
        s.add(Checkpoint(run_id=done, attempt=1, step=2, path="/c/2", bytes=1, sha256="0", params_digest="0",
                         blocked_s=0.1, total_s=0.2, created_at=2.0, pinned=True))
        s.commit()
        with pytest.raises(EditRefused, match=rf"run {live} is RUNNING: cancel it first \(`runyard cancel {live}`"):
            delete_run(s, live, settings.runs_dir)
        plan = deletion_plan(s, done)
        assert plan.refused is None and "1 pinned checkpoint(s) go too: #" in plan.confirmation()
        assert "at step 2" in plan.confirmation()
        folder = Path(s.get(Run, done).run_dir)
        assert folder.is_dir()
        message = delete_run(s, done, settings.runs_dir, who="test")
        assert message == f"run {done} deleted with its folder {folder}, 1 pinned checkpoint(s) with it"
        assert not folder.exists() and s.get(Run, done) is None
        assert s.scalar(select(Checkpoint.id).where(Checkpoint.run_id == done)) is None
        assert s.get(Run, live) is not None and Path(s.get(Run, live).run_dir).is_dir()


def test_delete_is_refused_while_a_fork_may_still_start_from_its_checkpoint(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        parent = _run(s, settings, "parent")
        fork = _run(s, settings, "fork", ends=None)
        s.get(Run, fork).parent_run_id = parent
        s.commit()
        assert deletion_plan(s, parent).refused == (
            f"run {fork} (QUEUED) was forked from run {parent} and may still start from its checkpoint: let it "
            "finish or cancel it first")


def test_a_run_queued_to_resume_shows_the_resume_step_no_eta_no_abandoned_eval_and_no_paused_time(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    """Issue 29 item 4: a run that reached step 10 (eval at 9), was paused for an hour, then queued
    to resume from its checkpoint at step 5: the page's numbers are the lineage's. Step 5 (not
    10), no ETA, no eval from step 9 (abandoned by the resume), elapsed the attempt's 100 s."""
    with sessions() as s:
        run_id = _run(s, settings, "paused", ends=RunStatus.RUNNING)
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
