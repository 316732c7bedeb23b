"""The scheduler's reconcile loop (orchestrator/scheduler/loop.py), driven by calling ``tick()``
directly on the small programs of tests/unit/orchestrator/fake_runs.py; the real torchrun path is
covered in tests/integration.
"""

from __future__ import annotations

import json
import sys
import time
from itertools import pairwise
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_sessionmaker, upgrade
from db.models import Attempt, Run, RunStatusHistory, SchedulerHeartbeat
from db.queries import HEARTBEAT_STALE_S
from db.requests import request_cancel, request_resume
from db.vocabulary.config import RunConfig, parse_config
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.scheduler import loop as scheduler_module
from orchestrator.scheduler.loop import Scheduler
from orchestrator.submission import submit
from tests.unit.orchestrator.fake_runs import attempts, make_scheduler, queue, status, tick_until


def test_admits_fifo_while_slots_are_free(sessions: sessionmaker[Session], settings: Settings) -> None:
    big = queue(sessions, settings, "quick", nproc=2)
    small = queue(sessions, settings, "quick", nproc=1)
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    assert status(sessions, big) == "STARTING"
    assert status(sessions, small) == "QUEUED"  # 2 slots are taken
    tick_until(scheduler, lambda: status(sessions, small) in ("STARTING", "SUCCEEDED"))
    assert status(sessions, big) == "SUCCEEDED"


def test_runs_that_fit_run_side_by_side(sessions: sessionmaker[Session], settings: Settings) -> None:
    a = queue(sessions, settings, "long", nproc=1)
    b = queue(sessions, settings, "long", nproc=1)
    c = queue(sessions, settings, "long", nproc=1)
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    assert [status(sessions, r) for r in (a, b, c)] == ["STARTING", "STARTING", "QUEUED"]
    ports = {attempts(sessions, r)[0].port for r in (a, b)}
    assert len(ports) == 2  # each run has its own rendezvous port


def test_a_queued_run_says_what_it_waits_for(sessions: sessionmaker[Session], settings: Settings) -> None:
    running = queue(sessions, settings, "long", nproc=2)
    first = queue(sessions, settings, "long", nproc=1)
    second = queue(sessions, settings, "long", nproc=2)
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    with sessions() as s:
        reasons = {r.id: r.status_reason for r in s.scalars(select(Run))}
    assert reasons[first] == f"queued: waiting for 1 free CPU slot(s) (2 of 2 in use by run(s) #{running})"
    assert reasons[second] == f"queued: waiting behind 1 earlier run(s) (#{first}), first come first served"
    request_cancel_all(sessions, scheduler, [running, first, second])


def request_cancel_all(sessions: sessionmaker[Session], scheduler: Scheduler, run_ids: list[int]) -> None:
    with sessions() as s:
        for run_id in run_ids:
            request_cancel(s, run_id)
        s.commit()
    tick_until(scheduler, lambda: all(status(sessions, r) == "CANCELLED" for r in run_ids))


def test_exit_codes_decide_the_outcome(sessions: sessionmaker[Session], settings: Settings) -> None:
    ok = queue(sessions, settings, "quick")
    bad = queue(sessions, settings, "fails", retry={"max_retries": 0})
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, ok) == "SUCCEEDED" and status(sessions, bad) == "FAILED")
    (attempt,) = attempts(sessions, bad)
    assert attempt.status == "FAILED" and attempt.exit_code == 3
    assert attempt.exception == "exit code 3"
    assert attempts(sessions, ok)[0].exit_code == 0


def test_first_reported_step_moves_to_running(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = queue(sessions, settings, "long")
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    assert status(sessions, run_id) == "STARTING"
    with sessions() as s:  # what rank 0's reporter writes after step 1
        s.execute(update(Attempt).where(Attempt.run_id == run_id)
                  .values(first_step_at=time.time(), last_step=1))
        s.commit()
    scheduler.tick()
    assert status(sessions, run_id) == "RUNNING"


def test_cancel_escalates_to_sigkill_after_grace(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = queue(sessions, settings, "stubborn", supervision={"grace_s": 1.0})
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    (attempt,) = attempts(sessions, run_id)
    log = Path(attempt.dir) / "launcher.log"
    tick_until(scheduler, lambda: log.exists() and "ready" in log.read_text())  # SIGTERM is ignored from now on
    with sessions() as s:
        request_cancel(s, run_id)
        s.commit()
    tick_until(scheduler, lambda: status(sessions, run_id) == "CANCELLED", timeout=15)
    (attempt,) = attempts(sessions, run_id)
    assert attempt.status == "CANCELLED" and attempt.signal_sent == "SIGKILL"
    assert not psutil.pid_exists(attempt.pid) or psutil.Process(attempt.pid).status() == psutil.STATUS_ZOMBIE


def test_cancel_with_sigterm_is_enough_for_a_polite_process(sessions: sessionmaker[Session],
                                                            settings: Settings) -> None:
    run_id = queue(sessions, settings, "long")
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    with sessions() as s:
        request_cancel(s, run_id)
        s.commit()
    started = time.monotonic()
    tick_until(scheduler, lambda: status(sessions, run_id) == "CANCELLED")
    assert time.monotonic() - started < 10
    assert attempts(sessions, run_id)[0].signal_sent == "SIGTERM"


def test_a_paused_run_is_paused_not_cancelled_and_can_be_resumed_or_cancelled(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    running = queue(sessions, settings, "long")
    waiting = queue(sessions, settings, "long", nproc=2)
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    with sessions() as s:
        assert request_cancel(s, running, mode="pause") == f"run {running}: pause requested"
        request_cancel(s, waiting, mode="pause")  # queued: paused before launch
        s.commit()
    tick_until(scheduler, lambda: status(sessions, running) == "PAUSED")
    assert status(sessions, waiting) == "PAUSED"
    (attempt,) = attempts(sessions, running)
    assert attempt.status == "PAUSED" and (attempt.reason or "").startswith("paused at step")
    with sessions() as s:
        assert "cancelled (it was paused" in request_cancel(s, waiting)
        assert "already PAUSED; nothing to pause" in request_cancel(s, running, mode="pause")
        s.commit()
    assert status(sessions, waiting) == "CANCELLED"
    with sessions() as s:
        assert "already CANCELLED" in request_cancel(s, waiting)


def test_vanished_processes_are_recorded_as_crashed(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = queue(sessions, settings, "long", retry={"max_retries": 0})
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    (attempt,) = attempts(sessions, run_id)
    shim = psutil.Process(attempt.pid)
    for proc in [*shim.children(recursive=True), shim]:
        proc.kill()  # like the OOM killer taking the whole group
    tick_until(scheduler, lambda: status(sessions, run_id) == "FAILED")
    (attempt,) = attempts(sessions, run_id)
    assert attempt.status == "CRASHED" and attempt.exit_code is None
    assert attempt.cause == "VANISHED" and "vanished" in (attempt.exception or "")


def test_restarted_scheduler_adopts_instead_of_relaunching(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = queue(sessions, settings, "medium")
    first = make_scheduler(sessions, settings)
    first.tick()
    (attempt,) = attempts(sessions, run_id)
    del first  # the scheduler process dies; its child keeps running in its own session
    second = make_scheduler(sessions, settings)
    second.tick()
    assert psutil.Process(attempt.pid).is_running()
    tick_until(second, lambda: status(sessions, run_id) == "SUCCEEDED", timeout=20)
    assert len(attempts(sessions, run_id)) == 1  # launched once


def test_recycled_pid_is_not_mistaken_for_the_run(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = queue(sessions, settings, "long", retry={"max_retries": 0})
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    (attempt,) = attempts(sessions, run_id)
    for proc in [*psutil.Process(attempt.pid).children(recursive=True), psutil.Process(attempt.pid)]:
        proc.kill()
    with sessions() as s:  # pretend the pid now belongs to an unrelated process (this test process)
        s.execute(update(Attempt).where(Attempt.id == attempt.id).values(pid=psutil.Process().pid))
        s.commit()
    tick_until(scheduler, lambda: status(sessions, run_id) == "FAILED")


def test_heartbeat_is_rewritten_every_few_ticks(
    sessions: sessionmaker[Session], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert scheduler_module.BEAT_EVERY_S * 3 <= HEARTBEAT_STALE_S  # a live scheduler never looks stale
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    with sessions() as s:
        first = s.scalar(select(SchedulerHeartbeat.beat_at))
    assert first is not None
    scheduler.tick()  # within BEAT_EVERY_S: no write
    with sessions() as s:
        assert s.scalars(select(SchedulerHeartbeat.beat_at)).all() == [first]
    monkeypatch.setattr(scheduler_module, "BEAT_EVERY_S", 0.05)
    time.sleep(0.06)
    scheduler.tick()
    with sessions() as s:
        beats = s.scalars(select(SchedulerHeartbeat.beat_at)).all()
    assert len(beats) == 1 and beats[0] > first


def test_cancel_never_touches_another_data_folders_run(sessions: sessionmaker[Session], settings: Settings,
                                                       tmp_path: Path) -> None:
    """Run 1 attempt 1 exists in every data folder; a cancel must only reach its own."""
    other = Settings(home=tmp_path / "other", db_url=f"sqlite:///{tmp_path / 'other' / 'runyard.db'}")
    upgrade(other.db_url)
    other_sessions = make_sessionmaker(make_engine(other.db_url))
    mine = queue(sessions, settings, "long")
    theirs = queue(other_sessions, other, "long")
    assert mine == theirs == 1
    scheduler, bystander = make_scheduler(sessions, settings), make_scheduler(other_sessions, other)
    scheduler.tick()
    bystander.tick()
    with sessions() as s:
        request_cancel(s, mine)
        s.commit()
    tick_until(scheduler, lambda: status(sessions, mine) == "CANCELLED")
    bystander.tick()
    (their_attempt,) = attempts(other_sessions, theirs)
    assert status(other_sessions, theirs) == "STARTING"
    assert psutil.Process(their_attempt.pid).children(), "the other folder's run was signalled"


def test_failures_are_retried_with_backoff_until_the_budget_is_spent(sessions: sessionmaker[Session],
                                                                      settings: Settings) -> None:
    run_id = queue(sessions, settings, "fails", retry={"max_retries": 2, "backoff_s": 0.5, "backoff_max_s": 5})
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, run_id) == "FAILED", timeout=30)
    with sessions() as s:  # RETRYING between the attempts (one tick can settle and relaunch under load)
        moves = s.scalars(select(RunStatusHistory.to_status).where(RunStatusHistory.run_id == run_id)
                          .order_by(RunStatusHistory.id)).all()
    assert moves == ["QUEUED", *["STARTING", "RETRYING"] * 2, "STARTING", "FAILED"]
    tries = attempts(sessions, run_id)
    assert [a.number for a in tries] == [1, 2, 3]
    gaps = []
    for a, b in pairwise(tries):
        assert a.ended_at is not None, a.number
        gaps.append(b.started_at - a.ended_at)
    # backoff 0.5 s then 1 s, each with jitter in [0.5, 1.0]
    assert gaps[0] >= 0.25 and gaps[1] >= 0.5, gaps
    with sessions() as s:
        run = s.get_one(Run, run_id)
        assert run.retries_used == 2 and "gave up after 2 retries" in (run.status_reason or "")


def test_one_broken_run_does_not_stop_the_others(sessions: sessionmaker[Session], settings: Settings) -> None:
    broken = queue(sessions, settings, "long")
    healthy = queue(sessions, settings, "quick")
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    with sessions() as s:  # a row damaged by hand: its config no longer parses
        s.get_one(Run, broken).config_json = "{not json"
        s.commit()
    tick_until(scheduler, lambda: status(sessions, healthy) == "SUCCEEDED")
    assert status(sessions, broken) == "STARTING"


def test_a_run_paused_while_queued_is_held_and_resume_queues_it_from_the_start(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    """Issue 25 item 6: pausing a QUEUED run held it as PAUSED at step 0, and resume then refused
    ("no verified checkpoint to start from"): a dead end. Now resume lets it go from scratch."""
    run_id = queue(sessions, settings, "quick")
    with sessions() as s:
        assert request_cancel(s, run_id, mode="pause") == f"run {run_id}: pause requested"
        s.commit()
    scheduler = make_scheduler(sessions, settings)
    scheduler.tick()
    assert status(sessions, run_id) == "PAUSED" and attempts(sessions, run_id) == []  # held back
    with sessions() as s:
        assert request_resume(s, run_id, who="test") == 0
        s.commit()
    assert status(sessions, run_id) == "QUEUED"
    tick_until(scheduler, lambda: status(sessions, run_id) == "SUCCEEDED")
    (attempt,) = attempts(sessions, run_id)
    assert attempt.number == 1


ENV_PROBE = "import json, os, sys; json.dump({k: os.environ.get(k) for k in sys.argv[2:]}, open(sys.argv[1], 'w'))"


def test_a_local_gpu_run_gets_its_devices_in_nvml_order(sessions: sessionmaker[Session], settings: Settings,
                                                       tmp_path: Path) -> None:
    """The devices are NVML's indices, so CUDA must count them in the same (PCI bus) order. No GPU
    here: the inventory says two H100s, and the launched command only reports its environment."""
    gpus = Inventory(kind="gpu", slots=2, gpu_names=("NVIDIA H100 80GB HBM3",) * 2)
    probe = tmp_path / "env.json"

    def command(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path,
                **_: object) -> list[str]:
        return [sys.executable, "-c", ENV_PROBE, str(probe), "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"]

    run_id = submit(sessions, settings, parse_config({"name": "gpu", "launch": {"nproc_per_node": 2}}), gpus)
    scheduler = Scheduler(sessions, settings, gpus, command=command)
    tick_until(scheduler, lambda: status(sessions, run_id) in ("SUCCEEDED", "FAILED"))
    assert json.loads(probe.read_text()) == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
