"""Starting an attempt (orchestrator/scheduler/attempts.py): where it starts from is placed before
its rows are written, and a fork's file is copied before the fork's row.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import orchestrator.scheduler.attempts as attempts_module
import orchestrator.scripts.checkpoint_custody as checkpoint_custody
import orchestrator.submission as submission
from db.models import Attempt, Run
from db.requests import create_run, pin_script_copy
from db.states import transition
from db.vocabulary.settings import Settings
from orchestrator.scheduler.loop import Scheduler
from tests.unit.orchestrator.scripts.script_checkpoints import CPU2, rows, saved, script_run, workdir

__all__ = ["workdir"]  # the fixtures, from the helper module


def test_the_starting_point_is_placed_before_the_attempts_rows_are_written(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_launch(*_: object, **__: object) -> list[str]:
        raise OSError("not launched in this test")

    order: list[str] = []

    def spy(name: str, real: object) -> object:
        def wrapped(*args: object, **kwargs: object) -> object:
            order.append(name)
            return real(*args, **kwargs)  # type: ignore[operator]
        return wrapped

    monkeypatch.setattr(checkpoint_custody, "resume_point", spy("resume_point", checkpoint_custody.resume_point))
    monkeypatch.setattr(attempts_module, "transition", spy("transition", transition))
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    with sessions() as s:
        Scheduler(sessions, settings, CPU2, command=no_launch)._start_attempt(s, s.get_one(Run, run_id), [])
        attempt = s.scalars(select(Attempt).where(Attempt.run_id == run_id)).one()
    assert attempt.number == 1 and order[:2] == ["resume_point", "transition"]
    # A fork copies the parent's file before the fork's row is inserted.
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get_one(Run, run_id)
        saved(s, run, attempt, ckpt, b"v" * 10, time.time())
        s.commit()
        (row,) = rows(s, run_id)
    order.clear()
    monkeypatch.setattr(submission, "pin_script_copy", spy("copy", pin_script_copy))
    monkeypatch.setattr(submission, "create_run", spy("create_run", create_run))
    submission.fork(sessions, settings, run_id, None, [], CPU2, checkpoint_id=row.id)
    assert order == ["copy", "create_run"]
