"""Storage faults without torchrun: a full disk's classification and retry rule, the scheduler
that cannot write its database, and errors that repeat every tick.

The scheduler tests call ``tick()`` directly with a small Python program as the workload (as in
test_scheduler.py). A full disk cannot be made here (no small filesystem can be mounted), so the
free space the scheduler sees is replaced where it is read (``orchestrator.scheduler.admission.free_bytes``)
and a database that cannot grow is made with a real file-size limit in a subprocess
(tests/faults/test_storage.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy import event, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Event, Run
from db.queries import scheduler_status
from db.vocabulary.causes import Cause, normalize_exception
from db.vocabulary.config import RetryConfig, RunConfig
from db.vocabulary.scheduler_file import FILE_SIZE, SchedulerFile, read_scheduler_file
from db.vocabulary.settings import Settings
from orchestrator.executors import shim as shim_module
from orchestrator.scheduler import admission, storage
from orchestrator.scheduler import loop as scheduler_module
from orchestrator.scheduler.failures import classify
from orchestrator.scheduler.repeats import RepeatedErrors
from orchestrator.scheduler.retry import AttemptOutcome, decide
from tests.unit.test_scheduler import CPU2, attempts, make_scheduler, queue, status, tick_until

TRAIN = {"batch_size": 8, "grad_accum": 1}
EXC = ("CheckpointError: writing checkpoint step 20 to /data/runs/run-000001/checkpoints/.tmp-step-20-{} "
       "failed: [Errno 27] File too large")


# -- classification and the retry rule ---------------------------------------------------------


def _attempt_dir_with_error(tmp_path: Path, message: str) -> Path:
    """An attempt folder as torchrun leaves it after rank 0 raised ``message``."""
    attempt = tmp_path / "runs" / "run-000001" / "attempts" / "1"
    (attempt / "ranks").mkdir(parents=True)
    error_file = attempt / "error.json"
    error_file.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": "..."}}}))
    (attempt / "launcher.log").write_text(
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-24_05:00:00\n"
        "  host      : vm\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 4242)\n"
        f"  error_file: {error_file}\n  traceback : ...\n")
    return attempt


@pytest.mark.parametrize("message", [
    EXC.format("ab12cd34"),
    "OSError: [Errno 28] No space left on device: '/data/runs/run-000001/checkpoints/.tmp-step-5-0011/state.pt'",
    "RuntimeError: [enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file data/0: "
    "file write failed",
    "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database or disk is full",
    "OSError: [Errno 30] Read-only file system: '/data/runs/run-000001/checkpoints/.tmp-step-5-0011'",
])
def test_a_failed_write_for_want_of_space_is_a_disk_failure_naming_the_path_and_the_free_space(
    tmp_path: Path, message: str
) -> None:
    failure = classify(_attempt_dir_with_error(tmp_path, message), 1)

    assert failure.cause is Cause.DISK and failure.rank == 0
    assert failure.exception == message
    assert "free on its filesystem now" in failure.summary()
    if "/data/runs" in message:  # the path the write went to, not the run folder
        assert "writing /data/runs/run-000001/checkpoints/.tmp-step-" in failure.summary()


def test_volatile_parts_do_not_make_two_errors_different() -> None:
    assert normalize_exception(EXC.format("ab12cd34")) == normalize_exception(EXC.format("99ff0011"))
    a = "RuntimeError: <object at 0x7f3a2b1c9d40> failed in pid 4242 on 127.0.0.1:29500 at 05:01:02"
    b = "RuntimeError: <object at 0x7f00aa11bb22> failed in pid 77 on 127.0.0.1:41001 at 17:44:09"
    assert normalize_exception(a) == normalize_exception(b)
    assert normalize_exception("ValueError: step 12") != normalize_exception("ValueError: step 13")


def _disk(number: int, suffix: str, last_step: int = 25) -> AttemptOutcome:
    return AttemptOutcome(number, Cause.DISK, EXC.format(suffix), last_step)


def test_a_disk_failure_is_retried_once_there_is_room_and_counts() -> None:
    decision = decide(_disk(1, "ab12cd34"), [], 0, RetryConfig(max_retries=3), TRAIN)

    assert decision.retry and decision.counted
    assert "once the disk has room again" in decision.reason


def test_the_same_disk_error_at_the_same_step_twice_stops_although_the_temporary_names_differ() -> None:
    decision = decide(_disk(2, "99ff0011"), [_disk(1, "ab12cd34")], 1, RetryConfig(max_retries=3), TRAIN)

    assert not decision.retry
    assert "the same disk error at the same step twice" in decision.reason


def test_the_same_user_error_twice_is_recognised_across_temporary_names() -> None:
    text = "RuntimeError: cannot open /tmp/tmpa8f3k/shard-{}.bin"
    first = AttemptOutcome(1, Cause.USER_ERROR, text.format(1), 40)
    second = AttemptOutcome(2, Cause.USER_ERROR, text.format(1).replace("tmpa8f3k", "tmpzz91q"), 40)

    decision = decide(second, [first], 1, RetryConfig(max_retries=3), TRAIN)

    assert not decision.retry and "same exception at the same step twice" in decision.reason


# -- the scheduler waits for room --------------------------------------------------------------


def _fail_with_disk(sessions: sessionmaker[Session], run_id: int) -> None:
    """Make the run's finished attempt a DISK failure and its backoff over."""
    with sessions() as s:
        a = s.scalars(select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.number.desc())).first()
        a.cause = Cause.DISK.value
        run = s.get(Run, run_id)
        run.retry_at = time.time() - 1
        s.commit()


def test_a_disk_failure_is_not_retried_while_the_disk_is_still_full(
    sessions: sessionmaker[Session], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = make_scheduler(sessions, settings)
    run_id = queue(sessions, settings, "fails", retry={"max_retries": 2, "backoff_s": 60.0})
    tick_until(scheduler, lambda: status(sessions, run_id) == "RETRYING")
    _fail_with_disk(sessions, run_id)
    free = {"bytes": 10 * 2**20}
    monkeypatch.setattr(admission, "free_bytes", lambda path: free["bytes"])

    for _ in range(5):
        scheduler.tick()
        time.sleep(0.05)

    assert status(sessions, run_id) == "RETRYING" and len(attempts(sessions, run_id)) == 1
    with sessions() as s:
        run = s.get(Run, run_id)
        assert run.status_reason.startswith("waiting for disk space: 10.0 MiB free")
        waits = s.scalars(select(Event).where(Event.run_id == run_id, Event.kind == "disk")).all()
        assert len(waits) == 1  # said once, not every tick
        run.retry_at = time.time() - 1  # the next look is due (DISK_RECHECK_S later in real time)
        s.commit()

    free["bytes"] = 50 * 2**30
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)


# -- the database that cannot be written -------------------------------------------------------


def test_scheduler_file_is_rewritten_in_place_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    writer = SchedulerFile(path)
    assert writer.write({"written_at": 1.0, "db_error": None})
    inode, size = path.stat().st_ino, path.stat().st_size
    assert writer.write({"written_at": 2.0, "db_error": "database not writable: database or disk is full"})

    assert path.stat().st_ino == inode and path.stat().st_size == size == FILE_SIZE
    assert read_scheduler_file(path) == {"written_at": 2.0,
                                         "db_error": "database not writable: database or disk is full"}
    path.write_bytes(b'{"written_at": 3.')  # caught half-written
    assert read_scheduler_file(path) is None


def _refuse_writes(engine: object, when: dict[str, bool]) -> None:
    """Make every INSERT/UPDATE on ``engine`` fail as SQLite does on a full disk while ``when['on']``."""

    def before(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if when["on"] and statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            raise sqlite3.OperationalError("database or disk is full")

    event.listen(engine, "before_cursor_execute", before)


def test_a_scheduler_that_cannot_write_says_so_logs_once_and_catches_up(
    sessions: sessionmaker[Session], settings: Settings, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A database on a full disk refuses some writes and takes others (SQLite reuses its WAL's
    pages): one line when the fault starts and one when it is over, no traceback (issue 52 item
    10: a traceback every tick, 208 in two minutes)."""
    monkeypatch.setattr(scheduler_module, "BEAT_EVERY_S", 0.0)
    monkeypatch.setattr(storage, "CLEAR_AFTER_S", 0.5, raising=False)
    scheduler = make_scheduler(sessions, settings)
    run_id = queue(sessions, settings, "quick")
    tick_until(scheduler, lambda: status(sessions, run_id) in ("STARTING", "RUNNING"))
    refuse = {"on": True}
    _refuse_writes(sessions.kw["bind"], refuse)

    caplog.set_level(logging.INFO, logger="orchestrator.scheduler.loop")
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # the program ends after 0.3 s; its end cannot be recorded
        scheduler.tick()
        time.sleep(0.05)

    assert status(sessions, run_id) in ("STARTING", "RUNNING")
    with sessions() as s:
        seen = scheduler_status(s, heartbeat_file=settings.scheduler_file)
        offline_without_file = scheduler_status(s, now=time.time() + 60)
    assert seen["online"] and seen["db_error"] == "database not writable: database or disk is full"
    assert seen["db_error_since"] is not None
    assert not offline_without_file["online"]
    for tick in range(12):  # every third tick's writes pass, as on a full disk
        refuse["on"] = tick % 3 != 2
        scheduler.tick()
    assert not [r for r in caplog.records if r.exc_info]

    refuse["on"] = False
    tick_until(scheduler, lambda: status(sessions, run_id) == "SUCCEEDED")
    tick_until(scheduler, lambda: any("storage fault over" in r.getMessage() for r in caplog.records))
    for _ in range(2):
        scheduler.tick()
    with sessions() as s:
        assert scheduler_status(s, heartbeat_file=settings.scheduler_file)["db_error"] is None
    assert not [r for r in caplog.records if r.exc_info]
    started, over = [r.getMessage() for r in caplog.records if "storage fault" in r.getMessage()]
    assert "database or disk is full (first at heartbeat)" in started, started
    assert over.startswith("storage fault over after ") and "failed write(s) meanwhile" in over, over


def test_repeated_errors_are_logged_once_then_counted(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.repeats")
    errors = RepeatedErrors(log, summary_every_s=60)
    caplog.set_level(logging.INFO, logger="test.repeats")
    exc = OperationalError("UPDATE runs", {}, Exception("database or disk is full"))

    for i in range(1000):
        errors.failed("run 3", exc, now=1000.0 + i * 0.5)  # 500 s of ticks
    errors.succeeded("run 3", now=1600.0)

    lines = [r.getMessage() for r in caplog.records]
    assert sum(1 for r in caplog.records if r.exc_info) == 1
    counts = [ln for ln in lines if "the same error" in ln]
    assert 7 <= len(counts) <= 9  # one a minute
    assert "works again after failing 1000 time(s)" in lines[-1]


# -- read-only, full and deleted folders under real processes (issue 25, item 7) ----------------
#
# Real tmpfs mounts (this needs root and mount(8); the tests skip with the reason elsewhere). A
# mount cannot be remounted read-only while a file on it is open for writing (EBUSY), and the
# shim's launcher log stays open for the attempt's life: where a running attempt's folder must
# turn read-only, a read-only tmpfs is mounted over it instead, which is what every new open of
# a path there then meets (EROFS), the stand-in named in those tests.


@contextlib.contextmanager
def tmpfs(path: Path, options: str = "size=16m") -> Iterator[Path]:
    """A tmpfs mounted at ``path`` for the test's length; unmounted in ``finally``."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True, capture_output=True)


# Waits for a file to appear (argv[1]), then exits with argv[2]; no fixed sleep in the tests.
WAITER = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
sys.exit(int(sys.argv[2]))
"""


def _wait_for(what: str, done: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: not in {timeout:.0f} s"
        time.sleep(0.02)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _shim(exit_file: Path, go: Path, code: int, log: Path, retry_s: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RUNYARD_EXIT_RETRY_S": retry_s}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "orchestrator.executors.shim", "--exit-file", str(exit_file),
                                 "--", sys.executable, "-c", WAITER, str(go), str(code)],
                                stdout=out, stderr=out, env=env)


def test_a_shim_whose_folder_turns_read_only_writes_its_exit_file_once_it_can_naming_the_error(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "mnt") as mnt:
        attempt = mnt / "attempts" / "1"
        attempt.mkdir(parents=True)
        log, go = tmp_path / "shim.log", tmp_path / "go"
        shim = _shim(attempt / "exit.json", go, 3, log, retry_s="20")
        try:
            _wait_for("the shim's launch record names torchrun's stand-in",
                      lambda: '"node_pids": [' in _read(attempt / "launch.json")
                      and '"node_pids": []' not in _read(attempt / "launch.json"))
            remount(mnt, "ro")  # a real read-only filesystem: the shim keeps no file open on it
            go.touch()
            _wait_for("the shim says it cannot write", lambda: "cannot write the exit file" in _read(log))
            assert not (attempt / "exit.json").exists()
            remount(mnt, "rw")
            assert shim.wait(timeout=10) == 3
        finally:
            go.touch()
            shim.kill()
        record = json.loads((attempt / "exit.json").read_text())
    assert record["exit_code"] == 3
    assert record["storage_error"]["errno"] == errno.EROFS
    assert "Read-only file system" in record["storage_error"]["message"]
    assert str(attempt) in record["storage_error"]["path"]


def test_on_a_full_disk_the_shim_still_writes_its_exit_file(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", "size=1m") as mnt:
        attempt = mnt / "attempts" / "1"
        attempt.mkdir(parents=True)
        log, go = tmp_path / "shim.log", tmp_path / "go"
        shim = _shim(attempt / "exit.json", go, 4, log, retry_s="0")  # not 1, which a crashed shim exits with
        try:
            _wait_for("the shim's launch record", lambda: (attempt / "launch.json").exists())
            with pytest.raises(OSError) as full, open(mnt / "filler", "wb") as filler:  # noqa: PT011, PT012 - fills the disk to ENOSPC
                while True:  # fill the filesystem to the last page
                    filler.write(b"\0" * 65536)
                    filler.flush()
            assert full.value.errno == errno.ENOSPC
            go.touch()
            assert shim.wait(timeout=10) == 4, _read(log)
        finally:
            go.touch()
            shim.kill()
        record = json.loads((attempt / "exit.json").read_text())  # written into the page reserved at launch
        launch = json.loads((attempt / "launch.json").read_text())
    assert record["exit_code"] == 4 and "storage_error" not in record
    assert launch["torchrun_pid"] == launch["node_pids"][0] > 0  # the second version had its page too


def test_the_launch_record_s_second_version_is_written_on_a_disk_filled_after_the_first(tmp_path: Path) -> None:
    """The order the shim keeps, made deterministic: the disk fills between the two versions
    (the race that once crashed the shim before it could write its exit file)."""
    with tmpfs(tmp_path / "mnt", "size=1m") as mnt:
        record = str(mnt / "launch.json")
        shim_module.reserve(record, suffix=shim_module.LAUNCH_RESERVE)
        shim_module.write_launch_record(record)
        with pytest.raises(OSError) as full, open(mnt / "filler", "wb") as filler:  # noqa: PT011, PT012 - fills the disk to ENOSPC
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        assert full.value.errno == errno.ENOSPC
        shim_module.write_launch_record(record, [psutil.Process()])
        written = json.loads(Path(record).read_text())
    assert written["torchrun_pid"] == os.getpid() and written["node_pids"] == [os.getpid()]


def _waiter_scheduler(sessions: sessionmaker[Session], settings: Settings, go: Path) -> scheduler_module.Scheduler:
    def command(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path,
                **_: object) -> list[str]:
        return [sys.executable, "-c", WAITER, str(go), "0"]

    return scheduler_module.Scheduler(sessions, settings, CPU2, command=command)


def _due_now(sessions: sessionmaker[Session], run_id: int) -> None:
    """The run's next look is due (DISK_RECHECK_S or the backoff later, in real time)."""
    with sessions() as s:
        s.get(Run, run_id).retry_at = time.time() - 1
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
        assert first.exception.startswith("launch failed: [Errno 30] Read-only file system: ")
        assert str(settings.runs_dir) in first.exception
        assert "EROFS: writing " in first.reason
        assert not [r for r in caplog.records if r.exc_info]  # one line, no traceback
        assert sum("launch failed: [Errno 30]" in r.getMessage() for r in caplog.records) == 1

        _due_now(sessions, run_id)
        for _ in range(3):
            scheduler.tick()
        assert len(attempts(sessions, run_id)) == 1  # still read-only: the retry waits
        with sessions() as s:
            reason = s.get(Run, run_id).status_reason
            waits = s.scalars(select(Event).where(Event.run_id == run_id, Event.kind == "disk")).all()
        assert reason.startswith("waiting for the run folder to be writable again: EROFS (Read-only file system)")
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
    assert "the launcher ended without an exit file: [Errno 30] Read-only file system" in attempt.exception
    assert attempt.dir in attempt.exception
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
        _wait_for("the shim's launch record names the workload (its exit file's page is reserved)",
                  lambda: '"node_pids": [' in _read(launch) and '"node_pids": []' not in _read(launch))
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
        assert f"ENOSPC: writing {attempt.dir}" in attempt.reason
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
        run_dir = Path(s.get(Run, run_id).run_dir)
    shutil.rmtree(run_dir)
    go.touch()
    tick_until(scheduler, lambda: status(sessions, run_id) in ("FAILED", "RETRYING", "SUCCEEDED"))

    assert status(sessions, run_id) == "FAILED"
    (attempt,) = attempts(sessions, run_id)
    assert attempt.cause == Cause.RUN_DIR_DELETED.value
    with sessions() as s:
        reason = s.get(Run, run_id).status_reason
    assert f"the run folder {run_dir} was deleted while the run was running" in reason
    assert "fix the code" not in reason


def test_a_read_only_mount_again_is_retried_not_taken_for_a_size_limit() -> None:
    text = "OSError: [Errno 30] Read-only file system: '/data/runs/run-000001/checkpoints/.tmp-step-20-{}'"
    first = AttemptOutcome(1, Cause.DISK, text.format("ab12"), 25)
    again = AttemptOutcome(2, Cause.DISK, text.format("cd34"), 25)

    decision = decide(again, [first], 1, RetryConfig(max_retries=3), TRAIN)

    assert decision.retry and "the run folder is writable" in decision.reason
    gone = decide(AttemptOutcome(1, Cause.RUN_DIR_DELETED, "the run folder /x was deleted while the run was running",
                                 5), [], 0, RetryConfig(max_retries=3), TRAIN)
    assert not gone.retry and "was deleted" in gone.reason
