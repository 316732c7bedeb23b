"""Storage faults without torchrun or a mount (orchestrator/scheduler/storage.py and the decisions
it informs): a full disk's classification and retry rule, the retry that waits for room, and the
scheduler that cannot write its database.

The scheduler tests call ``tick()`` directly with a small Python program as the workload
(tests/unit/orchestrator/fake_runs.py). A full disk cannot be made here, so the free space the
scheduler sees is replaced where it is read (``orchestrator.scheduler.admission.free_bytes``);
tests/unit/orchestrator/scheduler/test_storage_mounts.py has real mounts, and a database that
cannot grow is made with a real file-size limit in a subprocess (tests/faults/test_storage.py).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Event, Run
from db.queries import scheduler_status
from db.vocabulary.causes import Cause, normalize_exception
from db.vocabulary.config import RetryConfig
from db.vocabulary.settings import Settings
from orchestrator.scheduler import admission, storage
from orchestrator.scheduler import loop as scheduler_module
from orchestrator.scheduler.failures import classify
from orchestrator.scheduler.retry import AttemptOutcome, decide
from tests.unit.orchestrator.fake_runs import attempts, make_scheduler, queue, status, tick_until

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
        assert a is not None
        a.cause = Cause.DISK.value
        run = s.get_one(Run, run_id)
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
        run = s.get_one(Run, run_id)
        assert (run.status_reason or "").startswith("waiting for disk space: 10.0 MiB free")
        waits = s.scalars(select(Event).where(Event.run_id == run_id, Event.kind == "disk")).all()
        assert len(waits) == 1  # said once, not every tick
        run.retry_at = time.time() - 1  # the next look is due (DISK_RECHECK_S later in real time)
        s.commit()

    free["bytes"] = 50 * 2**30
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)


def _refuse_writes(engine: object, when: dict[str, bool]) -> None:
    """Make every INSERT/UPDATE on ``engine`` fail as SQLite does on a full disk while ``when['on']``."""

    def before(conn, cursor, statement, parameters, context, executemany):
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


def test_a_read_only_mount_again_is_retried_not_taken_for_a_size_limit() -> None:
    text = "OSError: [Errno 30] Read-only file system: '/data/runs/run-000001/checkpoints/.tmp-step-20-{}'"
    first = AttemptOutcome(1, Cause.DISK, text.format("ab12"), 25)
    again = AttemptOutcome(2, Cause.DISK, text.format("cd34"), 25)

    decision = decide(again, [first], 1, RetryConfig(max_retries=3), TRAIN)

    assert decision.retry and "the run folder is writable" in decision.reason
    gone = decide(AttemptOutcome(1, Cause.RUN_DIR_DELETED, "the run folder /x was deleted while the run was running",
                                 5), [], 0, RetryConfig(max_retries=3), TRAIN)
    assert not gone.retry and "was deleted" in gone.reason
