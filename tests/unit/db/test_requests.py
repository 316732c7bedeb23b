"""A person's requests on a script run (db/requests.py): a pause is refused without a checkpoint
source and says which version counts, and a finished script run is rerun without one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.models import Run
from db.requests import RequestRefused, request_cancel, request_rerun
from db.states import RunStatus, transition
from db.vocabulary.settings import Settings
from orchestrator.scripts.checkpoint_custody import resume_point
from tests.unit.orchestrator.scripts.script_checkpoints import add_attempt, saved, script_run, workdir, write

__all__ = ["workdir"]  # the fixtures, from the helper module


def test_pause_of_a_plain_script_without_a_checkpoint_source_is_refused(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    plain = script_run(sessions, settings, workdir)
    with_glob = script_run(sessions, settings, workdir, checkpoint_glob="snapshot.pt")
    with sessions() as s:
        for run_id in (plain, with_glob):
            transition(s, run_id, RunStatus.STARTING, "t")
            transition(s, run_id, RunStatus.RUNNING, "t")
        with pytest.raises(RequestRefused, match=r"no checkpoint source.*workload\.checkpoint_glob.*SDK"):
            request_cancel(s, plain, mode="pause")
        assert s.get_one(Run, plain).status == "RUNNING"
        message = request_cancel(s, with_glob, mode="pause")
        assert "snapshot.pt" in message and s.get_one(Run, with_glob).status == "PAUSING"
        assert "cancel requested" in request_cancel(s, plain)  # cancel stays possible


def test_rerun_queues_a_finished_script_run_without_a_checkpoint(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    with sessions() as s:
        transition(s, run_id, RunStatus.STARTING, "t")
        with pytest.raises(RequestRefused, match="only a finished run can be rerun"):
            request_rerun(s, run_id)
        transition(s, run_id, RunStatus.FAILED, "t")
        assert str(workdir) in request_rerun(s, run_id)
        run = s.get_one(Run, run_id)
        assert run.status == "QUEUED" and run.start_fresh and run.resume_checkpoint_id is None
        assert resume_point(s, run, 2) is None


def test_a_pause_while_the_script_rewrites_its_file_says_the_next_recorded_version_counts(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get_one(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        saved(s, run, attempt, ckpt, b"a" * 100, time.time() - 20)
        s.commit()
        assert "as written at step" in request_cancel(s, run_id, mode="pause")
        s.rollback()
        write(ckpt, b"b" * 50, time.time())  # being written: not recorded yet
        assert "is being rewritten" in request_cancel(s, run_id, mode="pause")
