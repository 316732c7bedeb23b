"""What the scheduler watches of a script run (orchestrator/scripts/attempt_watch.py): a failing
script watcher does not stop the rest of the supervision, watchers of ended attempts are
forgotten, files are hashed before anything is written (and to completion when the attempt ends),
and how a script run is described (its folder, its interpreter, what its hang watchdog watches)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.file_versions import sha256_of
from db.models import Attempt, Checkpoint, Event, Run
from db.queries import run_detail
from db.requests import request_cancel
from db.vocabulary.config import RunConfig, config_from_json, parse_config
from db.vocabulary.settings import Settings
from orchestrator.scheduler.loop import Scheduler
from orchestrator.scripts import attempt_watch as script_supervision
from orchestrator.scripts.attempt_watch import UNMATCHED_EVENT, ScriptWatch, script_facts
from orchestrator.scripts.checkpoint_finder import CheckpointFiles
from orchestrator.submission import submit
from tests.unit.orchestrator.fake_runs import CPU2, attempts, make_scheduler, status, tick_until


def script_run(sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, name: str,
               **sections: dict[str, object]) -> int:
    """A script run; ``name`` picks the fake workload of tests/unit/orchestrator/fake_runs.py instead of torchrun."""
    workdir = tmp_path / "work"
    (workdir / "out").mkdir(parents=True, exist_ok=True)
    (workdir / "train.py").write_text("print('hi')\n")
    config = parse_config({"name": name, "workload": {"kind": "script", "script": str(workdir / "train.py"),
                                                      "workdir": str(workdir), "checkpoint_glob": "out/ckpt.pt"},
                           **sections})
    return submit(sessions, settings, config, CPU2)


def warnings(sessions: sessionmaker[Session], run_id: int) -> list[str]:
    with sessions() as s:
        return [e.message for e in s.scalars(select(Event).where(Event.run_id == run_id, Event.level == "warning"))]


def test_a_failing_script_tick_does_not_stop_cancel_and_is_told_once(
        sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = script_run(sessions, settings, tmp_path, "long")
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: (run_id, 1) in scheduler.scripts.live())  # launched and watched

    def broken(*_: object) -> None:
        raise OSError("the scan failed")

    monkeypatch.setattr(scheduler.scripts, "tick", broken)
    scheduler.tick()
    scheduler.tick()
    assert (run_id, 1) not in scheduler.scripts.live()  # forgotten: read again from the start
    with sessions() as s:
        request_cancel(s, run_id)
        s.commit()
    tick_until(scheduler, lambda: status(sessions, run_id) == "CANCELLED", timeout=15)
    told = [m for m in warnings(sessions, run_id) if "the scan failed" in m]
    assert len(told) == 1 and "(tick)" in told[0]


def test_a_failing_script_finish_still_settles_the_attempt(
        sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = script_run(sessions, settings, tmp_path, "quick")
    scheduler = make_scheduler(sessions, settings)

    def broken(*_: object) -> None:
        raise RuntimeError("hashing failed")

    monkeypatch.setattr(scheduler.scripts, "finish", broken)
    tick_until(scheduler, lambda: status(sessions, run_id) == "SUCCEEDED")
    (attempt,) = attempts(sessions, run_id)
    assert attempt.status == "SUCCEEDED" and attempt.ended_at is not None
    assert any("hashing failed" in m and "(finish)" in m for m in warnings(sessions, run_id))
    assert scheduler.scripts.live() == set()


def test_a_rolled_back_tick_forgets_what_the_collector_read(
        sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = script_run(sessions, settings, tmp_path, "long")
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: (run_id, 1) in scheduler.scripts.live())
    real_tick = scheduler.scripts.tick

    def write_then_fail(session: Session, *args: object) -> None:
        real_tick(session, *args)  # type: ignore[arg-type]
        raise OSError("disk full")

    monkeypatch.setattr(scheduler.scripts, "tick", write_then_fail)
    scheduler.tick()
    assert (run_id, 1) not in scheduler.scripts.live()
    monkeypatch.undo()
    scheduler.tick()
    assert (run_id, 1) in scheduler.scripts.live()  # a new collector: from the start of the logs
    with sessions() as s:
        request_cancel(s, run_id)
        s.commit()
    tick_until(scheduler, lambda: status(sessions, run_id) == "CANCELLED", timeout=15)


def test_watchers_of_attempts_that_are_not_running_are_pruned(
        sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    scheduler = make_scheduler(sessions, settings)
    watch = scheduler.scripts
    with sessions() as s:
        run_id = script_run(sessions, settings, tmp_path, "quick")
        run = s.get_one(Run, run_id)
        attempt = Attempt(run_id=run_id, number=1, status="FAILED", dir=str(tmp_path / "a1"),
                          started_at=time.time())
        s.add(attempt)
        s.commit()
        watch._watched(run, attempt, config_from_json(run.config_json))
        assert watch.live() == {(run_id, 1)}
        scheduler._prune_script_watchers(s)
    assert watch.live() == set()


def test_files_are_hashed_before_anything_is_written_and_to_completion_at_the_end(
        sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = script_run(sessions, settings, tmp_path, "quick")
    ckpt = tmp_path / "work" / "out" / "ckpt.pt"
    ckpt.write_bytes(b"x" * 3000)
    order: list[str] = []
    real_scan = CheckpointFiles.scan

    def scan(self: CheckpointFiles) -> list:
        order.append("scan")
        return real_scan(self)

    real_store = ScriptWatch._store

    def store(*args: object) -> None:
        order.append("write")
        real_store(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(CheckpointFiles, "scan", scan)
    monkeypatch.setattr(ScriptWatch, "_store", staticmethod(store))
    monkeypatch.setattr(script_supervision, "FINAL_LOOKS", 2)
    watch = ScriptWatch()
    with sessions() as s:
        run = s.get_one(Run, run_id)
        attempt = Attempt(run_id=run_id, number=1, status="RUNNING", dir=str(tmp_path / "a1"),
                          started_at=time.time() - 60)
        (tmp_path / "a1").mkdir()
        s.add(attempt)
        s.commit()
        config = config_from_json(run.config_json)
        watch.tick(s, run, attempt, config)
        assert order[:2] == ["scan", "write"]
        watch._watched(run, attempt, config).checkpoints.hash_budget = 1000  # type: ignore[union-attr]
        order.clear()
        watch.finish(s, run, attempt, config)  # 2 looks of 1000 bytes would not hash 3000
        assert "write" in order and order.index("write") > max(i for i, x in enumerate(order) if x == "scan")
        s.commit()
        (row,) = s.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id))
        assert row.verified and row.sha256 == sha256_of(ckpt)


def _printed(attempt_dir: Path, text: str) -> None:
    """Rank 0 printed ``text`` (torchrun's per-rank log layout)."""
    log = attempt_dir / "ranks" / "r_x" / "attempt_0" / "0" / "stdout.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(text + "\n")


def test_a_glob_that_matched_nothing_after_a_save_is_said_once_and_on_the_page(
        sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    run_id = script_run(sessions, settings, tmp_path, "quick")  # checkpoint_glob = "out/ckpt.pt"
    watch = ScriptWatch(saved_grace_s=0.5)
    attempt_dir = tmp_path / "a1"
    with sessions() as s:
        run = s.get_one(Run, run_id)
        attempt = Attempt(run_id=run_id, number=1, status="RUNNING", dir=str(attempt_dir), started_at=time.time())
        s.add(attempt)
        s.commit()
        config = config_from_json(run.config_json)
        _printed(attempt_dir, "Saving model checkpoint to hf_out/checkpoint-10")  # where the glob does not look
        watch.tick(s, run, attempt, config)
        s.commit()
        assert warnings(sessions, run_id) == []  # the file may follow its message: not yet
        time.sleep(0.6)
        watch.tick(s, run, attempt, config)
        watch.tick(s, run, attempt, config)
        s.commit()
        said = [e.message for e in s.scalars(select(Event).where(Event.kind == UNMATCHED_EVENT))]
        assert len(said) == 1
        assert "'out/ckpt.pt' has matched nothing" in said[0]
        assert "rank 0 printed 'Saving model checkpoint to hf_out/checkpoint-10'" in said[0]
        d = run_detail(s, run_id)
    facts = dict(script_facts(d["config"], d["attempts"], d["checkpoints"]))
    assert facts["checkpoint files"].startswith("'out/ckpt.pt' has matched nothing yet")


def test_a_glob_that_matches_after_a_save_is_not_said_and_after_long_training_it_is(
        sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    run_id = script_run(sessions, settings, tmp_path, "quick")
    watch = ScriptWatch(saved_grace_s=0.0, nothing_matched_after_s=3600)
    with sessions() as s:
        run = s.get_one(Run, run_id)
        config = config_from_json(run.config_json)
        saver = Attempt(run_id=run_id, number=1, status="RUNNING", dir=str(tmp_path / "a1"), started_at=time.time())
        s.add(saver)
        s.commit()
        _printed(tmp_path / "a1", "saving checkpoint to out")
        (tmp_path / "work" / "out" / "ckpt.pt").write_bytes(b"x")
        watch.tick(s, run, saver, config)
        watch.finish(s, run, saver, config)
        s.commit()
        assert warnings(sessions, run_id) == []
        (tmp_path / "work" / "out" / "ckpt.pt").unlink()
        trainer = Attempt(run_id=run_id, number=2, status="RUNNING", dir=str(tmp_path / "a2"),
                          started_at=time.time() - 4000, first_step_at=time.time() - 3700)
        s.add(trainer)
        s.commit()
        watch.tick(s, run, trainer, config)
        s.commit()
    (said,) = warnings(sessions, run_id)
    assert "has matched nothing" in said and "after 62 min of training" in said


def test_a_script_that_ignores_sigterm_stops_on_the_signal_it_chose(
        sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    """Lightning outside Slurm: SIGTERM only sets a flag. With workload.stop_signal = 'SIGINT' a
    cancel reaches it at once, not after supervision.grace_s and a SIGKILL."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('hi')\n")
    config = parse_config({"name": "stubborn", "workload": {"kind": "script", "script": str(workdir / "train.py"),
                                                            "workdir": str(workdir), "stop_signal": "SIGINT"},
                           "supervision": {"grace_s": 60}})
    run_id = submit(sessions, settings, config, CPU2)
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: (run_id, 1) in scheduler.scripts.live())  # launched and watched
    time.sleep(1.0)  # the fake script is up and ignores SIGTERM
    with sessions() as s:
        request_cancel(s, run_id)
        s.commit()
    started = time.monotonic()
    tick_until(scheduler, lambda: status(sessions, run_id) == "CANCELLED", timeout=20)
    assert time.monotonic() - started < 15  # far under grace_s
    (attempt,) = attempts(sessions, run_id)
    assert attempt.signal_sent == "SIGINT"
    with sessions() as s:
        said = [e.message for e in s.scalars(select(Event).where(Event.run_id == run_id, Event.kind == "signal"))]
    assert said == ["cancel: SIGINT sent; the ranks checkpoint and exit; SIGKILL in 60 s if still running"]


def test_a_stop_signal_other_than_sigterm_is_refused_on_slurm() -> None:
    with pytest.raises(ValueError, match=r"workload\.stop_signal = 'SIGINT' is for launch\.executor = 'local'"):
        parse_config({"workload": {"kind": "script", "script": "t.py", "stop_signal": "SIGINT"},
                      "launch": {"executor": "slurm"}})


# A plain script as torchrun leaves its rank 0 (ranks/<rdzv>/attempt_0/0/): it reports steps
# sparsely, up to a step that differs by attempt (argv[2]), then raises the same ValueError at the
# same place each time.
CRASH = """
import os, sys
logs = os.path.join(sys.argv[1], "ranks", "rdzv", "attempt_0", "0")
os.makedirs(logs)
with open(os.path.join(logs, "stdout.log"), "w") as out:
    for step in range(10, int(sys.argv[2]) + 1, 10):
        out.write('RUNYARD {"step": %d, "loss": 1.0}\\n' % step)
with open(os.path.join(logs, "stderr.log"), "w") as err:
    err.write('Traceback (most recent call last):\\n  File "/w/crash.py", line 8, in main\\n'
              '    raise ValueError("bad record 812")\\nValueError: bad record 812\\n')
sys.exit(1)
"""


def test_a_deterministic_exception_in_a_script_that_reports_steps_sparsely_fails_after_two_attempts(
        sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    """Issue 52 item 3: the last step each attempt reported differs (30, then 20), so "the same
    step" never matched and all four attempts ran; the same exception at the same place, twice in a
    row with no checkpoint past where each started, stops after two."""
    def command(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path,
                **_: object) -> list[str]:
        return [sys.executable, "-c", CRASH, str(attempt_dir), "30" if attempt == 1 else "20"]

    run_id = script_run(sessions, settings, tmp_path, "crash", retry={"max_retries": 3, "backoff_s": 0.0})
    scheduler = Scheduler(sessions, settings, CPU2, command=command)
    tick_until(scheduler, lambda: status(sessions, run_id) in ("FAILED", "SUCCEEDED"))

    tried = attempts(sessions, run_id)
    assert [(a.cause, a.last_step) for a in tried] == [("USER_ERROR", 30), ("USER_ERROR", 20)]
    assert tried[0].exception == "ValueError: bad record 812 (at crash.py:8 in main)"
    with sessions() as s:
        reason = s.get_one(Run, run_id).status_reason
    assert (reason or "").startswith("the same exception at the same place twice in a row (ValueError: bad record 812 "
                             "(at crash.py:8 in main)), and attempt 2 started from the beginning, having saved no "
                             "checkpoint: a third try would start there again"), reason
    assert (reason or "").endswith("fix the code or the data it names, then resume")


def test_a_script_run_says_where_it_runs_with_what_and_what_is_watched() -> None:
    config = {"workload": {"kind": "script", "workdir": "/w", "python": "/venv/bin/python"}}
    facts = dict(script_facts(config, [{"watching": "output"}]))
    assert facts["working directory"] == "/w" and facts["python"] == "/venv/bin/python"
    assert facts["hang watchdog watches"].startswith("the script's output")
    plain = dict(script_facts({"workload": {"kind": "script", "workdir": "/w"}}, [{"watching": None}]))
    assert "python" not in plain and plain["hang watchdog watches"].startswith("nothing yet")
    assert script_facts({"workload": {"kind": "mlp-digits"}}, []) == []
