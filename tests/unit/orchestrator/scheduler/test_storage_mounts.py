"""Read-only, full and deleted run folders under the scheduler's real processes (issue 25, item 7),
on the real tmpfs mounts of tests/unit/orchestrator/mounts.py: a launch on a read-only folder is
retried once it is writable, an exit file that cannot be written is a disk failure, a disk that
fills mid-run is a disk failure and one line, a deleted run folder is named and not retried.
"""

from __future__ import annotations

import errno
import logging
import shutil
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Event, Run
from db.vocabulary.causes import Cause
from db.vocabulary.config import RunConfig
from db.vocabulary.settings import Settings
from orchestrator.scheduler import loop as scheduler_module
from orchestrator.scheduler import storage
from tests.unit.orchestrator.fake_runs import CPU2, attempts, queue, status, tick_until
from tests.unit.orchestrator.mounts import WAITER, remount, text_of, tmpfs, wait_for


def _waiter_scheduler(sessions: sessionmaker[Session], settings: Settings, go: Path) -> scheduler_module.Scheduler:
    def command(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path,
                **_: object) -> list[str]:
        return [sys.executable, "-c", WAITER, str(go), "0"]

    return scheduler_module.Scheduler(sessions, settings, CPU2, command=command)


def _due_now(sessions: sessionmaker[Session], run_id: int) -> None:
    """The run's next look is due (DISK_RECHECK_S or the backoff later, in real time)."""
    with sessions() as s:
        s.get_one(Run, run_id).retry_at = time.time() - 1
        s.commit()


def test_a_launch_on_a_read_only_run_folder_is_retried_once_it_is_writable_again(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    go = tmp_path / "go"
    go.touch()  # the workload ends at once
    with tmpfs(settings.runs_dir):
        scheduler = _waiter_scheduler(sessions, settings, go)
        run_id = queue(sessions, settings, "quick", retry={"max_retries": 2, "backoff_s": 60.0})
        remount(settings.runs_dir, "ro")
        caplog.set_level(logging.WARNING)
        scheduler.tick()

        assert status(sessions, run_id) == "RETRYING"  # not FAILED with its retries unspent
        (first,) = attempts(sessions, run_id)
        assert first.cause == Cause.DISK.value
        assert (first.exception or "").startswith("launch failed: [Errno 30] Read-only file system: ")
        assert str(settings.runs_dir) in (first.exception or "")
        assert "EROFS: writing " in (first.reason or "")
        assert not [r for r in caplog.records if r.exc_info]  # one line, no traceback
        assert sum("launch failed: [Errno 30]" in r.getMessage() for r in caplog.records) == 1

        _due_now(sessions, run_id)
        for _ in range(3):
            scheduler.tick()
        assert len(attempts(sessions, run_id)) == 1  # still read-only: the retry waits
        with sessions() as s:
            reason = s.get_one(Run, run_id).status_reason
            waits = s.scalars(select(Event).where(Event.run_id == run_id, Event.kind == "disk")).all()
        assert (reason or "").startswith(
            "waiting for the run folder to be writable again: EROFS (Read-only file system)")
        assert len(waits) == 1

        remount(settings.runs_dir, "rw")
        _due_now(sessions, run_id)
        tick_until(scheduler, lambda: status(sessions, run_id) == "SUCCEEDED")
        assert len(attempts(sessions, run_id)) == 2


def test_an_exit_file_that_cannot_be_written_is_a_disk_failure_not_a_vanished_launcher(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNYARD_EXIT_RETRY_S", "0")  # the shim gives up at once
    go = tmp_path / "go"
    scheduler = _waiter_scheduler(sessions, settings, go)
    run_id = queue(sessions, settings, "quick", retry={"max_retries": 2, "backoff_s": 60.0})
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 1)
    (attempt,) = attempts(sessions, run_id)
    # The stand-in: a read-only tmpfs over the running attempt's folder (see the section's note).
    with tmpfs(Path(attempt.dir), "ro,size=1m"):
        go.touch()
        tick_until(scheduler, lambda: status(sessions, run_id) != "RUNNING" and status(sessions, run_id)
                   != "STARTING")
        (attempt,) = attempts(sessions, run_id)

    assert attempt.cause == Cause.DISK.value and attempt.status == "FAILED"  # not CRASHED/VANISHED
    assert "the launcher ended without an exit file: [Errno 30] Read-only file system" in (attempt.exception or "")
    assert attempt.dir in (attempt.exception or "")
    assert status(sessions, run_id) == "RETRYING"


def test_a_disk_that_fills_mid_run_is_a_disk_failure_not_a_hang_and_one_line(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 52 item 10: a full disk mid-run was booked "HANG on rank 0" (rank 0's progress could
    not be stored), spent a retry, and the watchdog detected the same hang every tick. While the
    attempt's folder cannot be written no hang is called (one event, one log line); the attempt's
    end with no evidence is DISK with the path and errno; one line when the disk has room again."""
    go = tmp_path / "go"

    def command(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path,
                **_: object) -> list[str]:
        return [sys.executable, "-c", WAITER, str(go), "1"]  # dies with exit code 1, its traceback unwritable

    with tmpfs(settings.runs_dir, "size=1m") as runs:
        monkeypatch.setattr(storage, "CLEAR_AFTER_S", 0.0, raising=False)
        scheduler = scheduler_module.Scheduler(sessions, settings, CPU2, command=command)
        run_id = queue(sessions, settings, "quick", retry={"max_retries": 2, "backoff_s": 0.0},
                       supervision={"hang_timeout_s": 1.0})
        tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 1)
        launch = Path(attempts(sessions, run_id)[0].dir) / "launch.json"
        wait_for("the shim's launch record names the workload (its exit file's page is reserved)",
                  lambda: '"node_pids": [' in text_of(launch) and '"node_pids": []' not in text_of(launch))
        with sessions() as s:  # rank 0 had reported step 5, 30 s ago, before the disk filled
            attempt = s.scalars(select(Attempt).where(Attempt.run_id == run_id)).one()
            attempt.first_step_at = attempt.progress_at = time.time() - 30
            attempt.last_step = 5
            s.commit()
        with pytest.raises(OSError) as full, open(runs / "filler", "wb") as filler:  # noqa: PT011, PT012 - fills the disk to ENOSPC
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        assert full.value.errno == errno.ENOSPC
        caplog.set_level(logging.INFO)
        for _ in range(4):
            scheduler.tick()

        (attempt,) = attempts(sessions, run_id)
        assert attempt.status == "RUNNING" and attempt.hang_detected_at is None
        with sessions() as s:
            kinds = [e.kind for e in s.scalars(select(Event).where(Event.run_id == run_id))]
            (held,) = s.scalars(select(Event.message).where(Event.run_id == run_id, Event.kind == "disk")).all()
        assert "hang" not in kinds
        assert "not called a hang" in held and "ENOSPC (No space left on device)" in held, held
        (line,) = [r.getMessage() for r in caplog.records if "storage fault" in r.getMessage()]
        assert line.startswith(f"storage fault: ENOSPC (No space left on device) writing in {attempt.dir}"), line

        go.touch()
        tick_until(scheduler, lambda: status(sessions, run_id) not in ("RUNNING", "STARTING"))
        (attempt,) = attempts(sessions, run_id)
        assert attempt.cause == Cause.DISK.value, attempt.reason
        assert attempt.exception == ("exit code 1 and no traceback, while the storage could not be written: "
                                     f"[Errno 28] No space left on device: '{attempt.dir}'")
        assert f"ENOSPC: writing {attempt.dir}" in (attempt.reason or "")
        assert status(sessions, run_id) == "RETRYING"
        assert not [r for r in caplog.records if r.exc_info]

        (runs / "filler").unlink()
        tick_until(scheduler, lambda: any("storage fault over" in r.getMessage() for r in caplog.records))
    lines = [r.getMessage() for r in caplog.records if "storage fault" in r.getMessage()]
    assert len(lines) == 2 and lines[1].startswith("storage fault over after "), lines


def test_a_run_folder_deleted_under_a_running_run_is_named_and_not_retried(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path,
) -> None:
    go = tmp_path / "go"
    scheduler = _waiter_scheduler(sessions, settings, go)
    run_id = queue(sessions, settings, "quick", retry={"max_retries": 3, "backoff_s": 0.1})
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 1)
    with sessions() as s:
        run_dir = Path(s.get_one(Run, run_id).run_dir)
    shutil.rmtree(run_dir)
    go.touch()
    tick_until(scheduler, lambda: status(sessions, run_id) in ("FAILED", "RETRYING", "SUCCEEDED"))

    assert status(sessions, run_id) == "FAILED"
    (attempt,) = attempts(sessions, run_id)
    assert attempt.cause == Cause.RUN_DIR_DELETED.value
    with sessions() as s:
        reason = s.get_one(Run, run_id).status_reason
    assert f"the run folder {run_dir} was deleted while the run was running" in (reason or "")
    assert "fix the code" not in (reason or "")
