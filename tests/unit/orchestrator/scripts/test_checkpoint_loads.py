"""A retry that failed loading its checkpoint (orchestrator/scripts/checkpoint_loads.py): the
version it failed on is refused, and the one before it taken (issue 52 item 2).
"""

from __future__ import annotations

import io
import time
import traceback
from pathlib import Path

import pytest
import torch
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Run
from db.requests import RequestRefused, request_resume
from db.vocabulary.settings import Settings
from orchestrator.scripts.checkpoint_custody import resume_point
from tests.unit.orchestrator.scripts.script_checkpoints import add_attempt, ended, rows, saved, script_run, workdir

__all__ = ["workdir"]  # the fixtures, from the helper module


def unloadable(path: Path) -> str:
    """What torch.load raised on ``path``, as the rank's traceback."""
    try:
        torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - whatever a broken file makes torch.load raise
        return traceback.format_exc()
    raise AssertionError(f"{path} loaded")


def failed_to_load(attempt: Attempt, tmp_path: Path, path: Path) -> None:
    """The attempt's rank 0 died in torch.load(path): its stderr, as torchrun keeps it."""
    stderr = tmp_path / "attempts" / str(attempt.number) / "ranks" / "r_1" / "attempt_0" / "0" / "stderr.log"
    stderr.parent.mkdir(parents=True)
    stderr.write_text(f"[rank0]: loading {path}\n" + unloadable(path))


def test_a_retry_that_fails_loading_its_checkpoint_falls_back_to_the_version_before(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path, tmp_path: Path) -> None:
    """Issue 52 item 2: a version that merely looked complete was handed to every retry, which
    failed in the script's load each time, and the run FAILED as the user's repeated error."""
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="ckpts/*.pt", resume_args=["--resume"])
    (workdir / "ckpts").mkdir()
    older, newer = workdir / "ckpts" / "step_100.pt", workdir / "ckpts" / "step_200.pt"
    buf = io.BytesIO()
    torch.save({"step": 200}, buf, _use_new_zipfile_serialization=False)  # a format with no end to check
    with sessions() as s:
        run = s.get_one(Run, run_id)
        first = add_attempt(s, run_id, 1, last_step=None)
        first.started_at = time.time() - 120
        torch.save({"step": 100}, older)
        saved(s, run, first, older, older.read_bytes(), time.time() - 60, step=100)
        saved(s, run, first, newer, buf.getvalue()[:-20], time.time() - 30, step=200)  # cut short, unseen
        s.commit()
        assert [c.verified for c in rows(s, run_id)] == [True, True]
        ended(s, run_id, first, tmp_path, last_step=205, code=1)
        assert run.status == "RETRYING"
        chosen = resume_point(s, run, 2)
        assert chosen is not None and chosen.path == str(newer)
        second = add_attempt(s, run_id, 2, last_step=None)
        second.started_at, second.resume_path, second.resume_step = time.time(), chosen.path, chosen.step
        failed_to_load(second, tmp_path, newer)
        run = ended(s, run_id, second, tmp_path, last_step=None, code=1)
        by_step = {c.step: c for c in rows(s, run_id)}
        assert run.status == "RETRYING", run.status_reason
        assert second.cause == "USER_ERROR"
        assert (by_step[200].refused_reason or "").startswith("attempt 2 failed loading it: ")
        said = f"the next attempt starts from the version before it, checkpoint {by_step[100].id}"
        assert said in (run.status_reason or "")
        chosen = resume_point(s, run, 3)
        assert chosen is not None and (chosen.path, chosen.step) == (str(older), 100)
        with pytest.raises(RequestRefused):
            request_resume(s, run_id, step=200)  # never again by step
