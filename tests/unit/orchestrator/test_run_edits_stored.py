"""A run's metadata after submit, stored (orchestrator/run_edits.py; issue 29, items 7 and 8): a
rename, tags and a note with one event per change, every problem together, star and archive,
and a delete refused while the run is active or a fork may still start from its checkpoint, on
SQLite and PostgreSQL; the decision alone is test_run_edits.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Checkpoint, Run
from db.queries import run_detail
from db.states import RunStatus
from db.vocabulary.settings import Settings
from orchestrator.run_edits import EditRefused, delete_run, deletion_plan, edit_run
from tests.unit.db.workspace_runs import add_losses, workspace_run

pytestmark = pytest.mark.both_dbs


def test_edit_renames_tags_and_notes_a_run_with_one_event_per_change(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        run_id = workspace_run(s, settings, "first", tags=("keep", "drop"))
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
        assert json.loads(s.get_one(Run, run_id).config_json)["name"] == "first"  # the config stays as submitted


def test_edit_reports_every_problem_together_and_changes_nothing(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        run_id = workspace_run(s, settings, "ok", tags=("a",))
        s.commit()
        with pytest.raises(EditRefused) as refused:
            edit_run(s, run_id, name="has space", add_tags=["fine", "bad,tag", ""], remove_tags=["zzz"],
                     note="x" * 5000)
        message = str(refused.value)
        for part in ("name 'has space': use letters, digits", "tag 'bad,tag': use letters", "tag '': use",
                     "remove tag 'zzz': run", "has no such tag (its tags: a)", "note: 5000 characters; at most 4000"):
            assert part in message, (part, message)
        s.rollback()
        run = s.get_one(Run, run_id)
        assert (run.name, run.tags_json, run.note) == ("ok", '["a"]', None)


def test_delete_is_refused_while_active_names_pinned_checkpoints_and_removes_the_folder(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        live = workspace_run(s, settings, "live", ends=RunStatus.RUNNING)
        done = workspace_run(s, settings, "done")
        add_losses(s, done, [1.0, 0.5])
        s.add(Checkpoint(run_id=done, attempt=1, step=2, path="/c/2", bytes=1, sha256="0", params_digest="0",
                         blocked_s=0.1, total_s=0.2, created_at=2.0, pinned=True))
        s.commit()
        with pytest.raises(EditRefused, match=rf"run {live} is RUNNING: cancel it first \(`runyard cancel {live}`"):
            delete_run(s, live, settings.runs_dir)
        plan = deletion_plan(s, done)
        assert plan.refused is None and "1 pinned checkpoint(s) go too: #" in plan.confirmation()
        assert "at step 2" in plan.confirmation()
        folder = Path(s.get_one(Run, done).run_dir)
        assert folder.is_dir()
        message = delete_run(s, done, settings.runs_dir, who="test")
        assert message == f"run {done} deleted with its folder {folder}, 1 pinned checkpoint(s) with it"
        assert not folder.exists() and s.get(Run, done) is None
        assert s.scalar(select(Checkpoint.id).where(Checkpoint.run_id == done)) is None
        assert s.get(Run, live) is not None and Path(s.get_one(Run, live).run_dir).is_dir()


def test_delete_is_refused_while_a_fork_may_still_start_from_its_checkpoint(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as s:
        parent = workspace_run(s, settings, "parent")
        fork = workspace_run(s, settings, "fork", ends=None)
        s.get_one(Run, fork).parent_run_id = parent
        s.commit()
        assert deletion_plan(s, parent).refused == (
            f"run {fork} (QUEUED) was forked from run {parent} and may still start from its checkpoint: let it "
            "finish or cancel it first")
