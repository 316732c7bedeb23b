"""A script run and its checkpoint files, for the tests of a script's own checkpoints: the run
submitted on a working directory, its attempts, the steps it reports, the versions of a file it
writes and runyard's look at them, and an attempt settled as the scheduler settles it.
"""

from __future__ import annotations

import io
import os
import time
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.file_versions import sha256_of
from db.metricstore import write_points
from db.models import Attempt, Checkpoint, Run
from db.states import AttemptStatus, RunStatus, transition
from db.vocabulary.config import parse_config
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.scheduler.outcomes import settle
from orchestrator.scripts.checkpoint_custody import record_versions
from orchestrator.scripts.checkpoint_finder import CheckpointFile
from orchestrator.submission import submit

CPU2 = Inventory(kind="cpu", slots=2)


# -- with a database ---------------------------------------------------------------------------


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    (folder / "out").mkdir(parents=True)
    (folder / "train.py").write_text("print('hi')\n")
    return folder


def script_run(sessions: sessionmaker[Session], settings: Settings, workdir: Path, **workload: object) -> int:
    config = parse_config({"name": "s", "workload": {"kind": "script", "script": str(workdir / "train.py"),
                                                     "workdir": str(workdir), **workload}})
    return submit(sessions, settings, config, CPU2)


def add_attempt(session: Session, run_id: int, number: int, last_step: int | None,
                status: AttemptStatus = AttemptStatus.RUNNING) -> Attempt:
    attempt = Attempt(run_id=run_id, number=number, status=status.value, dir="/tmp/none", started_at=time.time() - 60,
                      last_step=last_step)
    session.add(attempt)
    session.flush()
    return attempt


def report(session: Session, attempt: Attempt, step: int, at: float) -> None:
    """The script reported ``step`` at ``at`` (a printed line runyard read)."""
    points = [{"run_id": attempt.run_id, "attempt": attempt.number, "rank": 0, "step": step, "key": "loss",
               "value": 1.0, "wall_time": at}]
    write_points(session.connection(), points)


def write(path: Path, data: bytes, mtime: float) -> None:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


def saved(session: Session, run: Run, attempt: Attempt, ckpt: Path, data: bytes, at: float,
          step: int | None = None) -> None:
    """The script reported ``step`` (if given) a second before it wrote ``data`` to ``ckpt`` at
    ``at``; runyard then looked at the file."""
    if step is not None:
        report(session, attempt, step, at - 1)
    write(ckpt, data, at)
    record_versions(session, run, attempt, look(ckpt))


def look(path: Path) -> list[CheckpointFile]:
    st = path.stat()
    return [CheckpointFile(path, st.st_size, st.st_mtime, sha256_of(path), True)]


def rows(session: Session, run_id: int) -> list[Checkpoint]:
    return list(session.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.id)))


# -- what a retry must not start from, and where the file work happens -------------------------


def zip_bytes(payload: bytes) -> bytes:
    """What torch.save writes by default: a zip archive."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", payload)
    return buf.getvalue()


# -- issue 52: whose a file is, complete folders, a failed load, accelerate's names ------------


def ended(s: Session, run_id: int, attempt: Attempt, tmp_path: Path, *, last_step: int | None, code: int = 1,
          stop: str | None = None) -> Run:
    """Settle ``attempt`` of a RUNNING (or, with ``stop``, stopping) run as the scheduler does when
    its processes are gone, with exit ``code``; the run as it is then."""
    attempt.dir = str(tmp_path / "attempts" / str(attempt.number))
    Path(attempt.dir).mkdir(parents=True, exist_ok=True)
    attempt.last_step, attempt.stop_reason = last_step, stop
    run = s.get_one(Run, run_id)
    for status in (RunStatus.STARTING, RunStatus.RUNNING, *((RunStatus.PAUSING,) if stop else ())):
        if run.status != status.value:
            transition(s, run_id, status, "t")
    settle(s, run, attempt, {"exit_code": code, "ended_at": time.time()})
    s.commit()
    return run
