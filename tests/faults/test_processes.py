"""No process is lost track of (issue 14, items 1, 7, 8 and 11), with real torchrun ranks.

Each way a run used to train twice is reproduced: torchrun's agent killed with SIGKILL, the
launcher shim killed, the scheduler dying between starting an attempt and committing its pid.
In every case the watcher (tests/faults/conftest.py) must never see ranks of two attempts of one
run alive together, and a cancel must leave no process of the run behind. Then: an agent killed
from outside spends a retry (it is not a preemption); a hang where one rank alone stopped names
that rank; a stack dump that takes long does not hold up another run's supervision; and the
fault-injection hooks do nothing without their switch.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.executors.stacks import PY_SPY_TIMEOUT_S
from orchestrator.scheduler.loop import LAUNCH_LOST_S
from tests.faults.conftest import AttemptWatcher
from tests.integration.conftest import Product

pytestmark = pytest.mark.slow

# Long enough to kill it mid-way and see the retry train; every test ends it with a cancel.
LONG = ("train.max_steps=5000", "checkpoint.every_steps=20", "retry.backoff_s=0.5", "retry.max_retries=3")


def run_processes(run_dir: str, attempt: int | None = None) -> list[psutil.Process]:
    """Live (not zombie) processes carrying ``run_dir`` (and ``attempt``) in their environment."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
            if env.get("RUNYARD_RUN_DIR") != run_dir or (
                    attempt is not None and env.get("RUNYARD_ATTEMPT") != str(attempt)):
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def agent_of(run_dir: str, attempt: int) -> psutil.Process:
    """torchrun's agent of one attempt (the launcher runs torchrun as ``-m trainer.agent.torchrun``)."""
    for proc in run_processes(run_dir, attempt):
        try:
            argv = proc.cmdline()
            if ("trainer.agent.torchrun" in argv and "orchestrator.executors.shim" not in argv
                    and "LOCAL_RANK" not in proc.environ()):
                return proc
        except psutil.Error:
            continue
    raise AssertionError(f"no torchrun agent of attempt {attempt} under {run_dir}")


def ranks_of(run_dir: str, attempt: int) -> list[psutil.Process]:
    return [p for p in run_processes(run_dir, attempt) if "LOCAL_RANK" in p.environ()]


def gone_within(procs: list[psutil.Process], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs if _exists(p)):
            return True
        time.sleep(0.05)
    return False


def _exists(proc: psutil.Process) -> bool:
    try:
        return proc.is_running()
    except psutil.Error:
        return False


def attempt_step(product: Product, run_id: int, number: int, step: int, timeout: float = 120.0) -> None:
    """Wait until attempt ``number`` of the run reported ``step``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        con = sqlite3.connect(product.home / "runyard.db")
        try:
            row = con.execute("SELECT last_step FROM attempts WHERE run_id = ? AND number = ?",
                              (run_id, number)).fetchone()
        except sqlite3.OperationalError:
            row = None
        finally:
            con.close()
        if row and row[0] is not None and row[0] >= step:
            return
        time.sleep(0.1)
    raise AssertionError(f"attempt {number} of run {run_id} did not reach step {step} in {timeout:.0f} s")


def cancel_leaves_nothing(product: Product, run_id: int, run_dir: str) -> dict:
    """Cancel the run; it ends CANCELLED and no process of any of its attempts is left."""
    product.cli("cancel", str(run_id))
    detail = product.wait_status(run_id, "CANCELLED", "FAILED", "SUCCEEDED", timeout=120)
    assert detail["status"] == "CANCELLED", detail["status_reason"]
    left = run_processes(run_dir)
    assert not left, [" ".join(p.cmdline()) for p in left]
    return detail


def test_agent_killed_with_sigkill_takes_its_ranks_and_spends_a_retry(product: Product,
                                                                       watcher: AttemptWatcher) -> None:
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.05"
    run_id = product.submit(*LONG, "name=agent-killed")
    scheduler = product.start_scheduler()
    attempt_step(product, run_id, 1, 30)
    run_dir = product.show(run_id)["run_dir"]
    agent, ranks = agent_of(run_dir, 1), ranks_of(run_dir, 1)
    assert len(ranks) == 2
    # With the scheduler frozen nobody sweeps: the ranks must die with their agent by themselves.
    scheduler.send_signal(signal.SIGSTOP)
    try:
        agent.send_signal(signal.SIGKILL)
        assert gone_within(ranks, 10), "attempt 1's ranks outlived their torchrun agent"
    finally:
        scheduler.send_signal(signal.SIGCONT)
    attempt_step(product, run_id, 2, 10, timeout=120)
    detail = product.show(run_id)
    first = detail["attempts"][0]
    assert first["cause"] == "SIGNAL", first
    assert first["exception"] == f"the torchrun agent (pid {agent.pid}) was killed by SIGKILL"
    assert first["retry_counted"] is True and detail["retries_used"] == 1
    assert detail["attempts"][1]["resume_step"] == first["last_checkpoint_step"] is not None
    cancel_leaves_nothing(product, run_id, run_dir)
    watcher.assert_never_together()
    assert watcher.attempts_seen(run_dir) == {1, 2}


def test_killed_shim_takes_the_attempt_with_it(product: Product, watcher: AttemptWatcher) -> None:
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.05"
    run_id = product.submit(*LONG, "name=shim-killed")
    scheduler = product.start_scheduler()
    attempt_step(product, run_id, 1, 30)
    detail = product.show(run_id)
    run_dir, shim_pid = detail["run_dir"], detail["attempts"][0]["pid"]
    tree = run_processes(run_dir, 1)
    assert len(tree) >= 4  # shim, agent, two ranks
    scheduler.send_signal(signal.SIGSTOP)
    try:
        psutil.Process(shim_pid).send_signal(signal.SIGKILL)
        assert gone_within(tree, 10), "the agent or its ranks outlived the launcher shim"
    finally:
        scheduler.send_signal(signal.SIGCONT)
    attempt_step(product, run_id, 2, 10, timeout=120)
    first = product.show(run_id)["attempts"][0]
    assert first["cause"] == "VANISHED" and first["status"] == "CRASHED", first
    cancel_leaves_nothing(product, run_id, run_dir)
    watcher.assert_never_together()
    assert watcher.attempts_seen(run_dir) == {1, 2}


def test_scheduler_dead_before_committing_the_pid_adopts_from_the_launch_record(
    product: Product, watcher: AttemptWatcher
) -> None:
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.05"
    run_id = product.submit(*LONG, "name=pid-lost")
    product.env["RUNYARD_FAULT_EXIT_AFTER_LAUNCH"] = "1"
    first = product.start_scheduler()
    assert first.wait(60) == 70  # it died right after starting the launcher
    product.env.pop("RUNYARD_FAULT_EXIT_AFTER_LAUNCH")
    con = sqlite3.connect(product.home / "runyard.db")
    ((pid, started_at),) = con.execute("SELECT pid, started_at FROM attempts WHERE run_id = ?", (run_id,)).fetchall()
    con.close()
    assert pid is None
    product.start_scheduler()
    attempt_step(product, run_id, 1, 20)
    # Past the moment the old scheduler gave such an attempt up as vanished and launched another.
    while time.time() - started_at < LAUNCH_LOST_S + 5:
        time.sleep(0.5)
    detail = product.show(run_id)
    assert [a["number"] for a in detail["attempts"]] == [1] and detail["status"] == "RUNNING", detail["status_reason"]
    record = json.loads((Path(detail["attempts"][0]["dir"]) / "launch.json").read_text())
    assert detail["attempts"][0]["pid"] == record["shim_pid"]
    assert psutil.Process(record["torchrun_pid"]).create_time() == pytest.approx(record["torchrun_create_time"])
    assert any("adopted pid" in e["message"] for e in detail["events"]), detail["events"]
    cancel_leaves_nothing(product, run_id, detail["run_dir"])
    watcher.assert_never_together()
    assert watcher.attempts_seen(detail["run_dir"]) == {1}


@pytest.mark.parametrize("how", ["stall-rank-0", "sigstop-rank-1"])
def test_a_hang_with_one_rank_stopped_names_that_rank(product: Product, how: str) -> None:
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.02"
    culprit = 0 if how == "stall-rank-0" else 1
    if how == "stall-rank-0":
        product.env["RUNYARD_FAULT_STALL"] = "40:0"  # rank 0 sleeps in Python; rank 1 waits in the all-reduce
    run_id = product.submit("train.max_steps=3000", "supervision.hang_timeout_s=6", "supervision.hang_step_factor=1",
                            "retry.max_retries=0", f"name=hang-{how}")
    product.start_scheduler()
    product.wait_step(run_id, 30)
    if how == "sigstop-rank-1":
        run_dir = product.show(run_id)["run_dir"]
        (victim,) = [p for p in ranks_of(run_dir, 1) if p.environ()["LOCAL_RANK"] == "1"]
        victim.send_signal(signal.SIGSTOP)
    detail = product.wait_status(run_id, "FAILED", "SUCCEEDED", timeout=120)
    (attempt,) = detail["attempts"]
    assert attempt["cause"] == "HANG" and attempt["failed_rank"] == culprit, (attempt["cause"], attempt["failed_rank"])
    assert attempt["reason"].startswith(f"HANG on rank {culprit}:"), attempt["reason"]
    (stacks,) = [e["message"] for e in detail["events"] if e["kind"] == "stacks"]
    assert f"rank {culprit} " in stacks, stacks


def slow_py_spy(folder: Path) -> tuple[Path, Path]:
    """A stand-in for a py-spy that takes a minute per process (a huge heap, a slow ptrace):
    it notes its pid and start time in a file, then sleeps. Returns (its folder, the notes)."""
    folder.mkdir()
    notes = folder / "started.txt"
    tool = folder / "py-spy"
    tool.write_text(f'#!/bin/sh\necho "$$ $(date +%s.%N)" >> "{notes}"\nexec sleep 60\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return folder, notes


def test_a_slow_stack_dump_does_not_hold_up_another_run(product: Product, tmp_path: Path) -> None:
    folder, notes = slow_py_spy(tmp_path / "bin")
    product.env["PATH"] = f"{folder}{os.pathsep}{product.env['PATH']}"
    product.env["RUNYARD_CPU_SLOTS"] = "4"
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.02"
    hung = product.submit("train.max_steps=3000", "supervision.hang_timeout_s=5", "supervision.hang_step_factor=1",
                          "retry.max_retries=0", "name=hung")
    product.start_scheduler()
    product.wait_step(hung, 30)
    run_dir = product.show(hung)["run_dir"]
    (victim,) = [p for p in ranks_of(run_dir, 1) if p.environ()["LOCAL_RANK"] == "1"]
    victim.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 60
    while not (notes.exists() and len(notes.read_text().splitlines()) == 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    dump_began = min(float(line.split()[1]) for line in notes.read_text().splitlines())

    # While both py-spy dumps of the hung run sleep, the scheduler admits and launches another run.
    other = product.submit("train.max_steps=20", "name=bystander")
    launched = product.wait_for(other, lambda d: d["status"] != "QUEUED", timeout=30)
    seen_at = time.time()
    assert launched["status"] in ("STARTING", "RUNNING", "SUCCEEDED"), launched["status_reason"]
    assert seen_at - dump_began < PY_SPY_TIMEOUT_S, "the other run waited for the stack dump"

    # The hung run is killed only after its dump finished (py-spy ended at its timeout).
    detail = product.wait_status(hung, "FAILED", "SUCCEEDED", timeout=120)
    stacks = next(e for e in detail["events"] if e["kind"] == "stacks")
    assert stacks["at"] >= dump_began + PY_SPY_TIMEOUT_S - 0.5, (stacks["at"] - dump_began)
    assert detail["attempts"][0]["failed_rank"] == 1
    assert "timed out" in next(Path(detail["attempts"][0]["dir"], "stacks").glob("py-spy-*.txt")).read_text()
    assert product.wait_status(other, "SUCCEEDED", "FAILED", timeout=120)["status"] == "SUCCEEDED"


def test_fault_hooks_are_inert_without_the_switch(product: Product) -> None:
    product.env.pop("RUNYARD_FAULTS")
    product.env["RUNYARD_FAULT_RAISE"] = "1"  # every rank would raise at step 1
    product.env["RUNYARD_FAULT_EXIT_AFTER_LAUNCH"] = "1"  # the scheduler would exit at the launch
    run_id = product.submit("train.max_steps=20", "retry.max_retries=0", "name=no-switch")
    scheduler = product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=120)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert scheduler.poll() is None
    assert len(detail["attempts"]) == 1


def test_watcher_sees_two_attempts_together(tmp_path: Path) -> None:
    """The watcher itself: two fake 'ranks' of attempts 1 and 2 of one run, alive together."""
    run_dir = tmp_path / "home" / "runs" / "run-000001"
    env = {**os.environ, "RUNYARD_RUN_DIR": str(run_dir), "LOCAL_RANK": "0"}
    procs = [subprocess.Popen(["sleep", "30"], env={**env, "RUNYARD_ATTEMPT": str(n)}) for n in (1, 2)]
    try:
        with AttemptWatcher(tmp_path / "home") as w:
            deadline = time.monotonic() + 10
            while not w.overlaps() and time.monotonic() < deadline:
                time.sleep(0.05)
        with pytest.raises(AssertionError, match=r"attempt 1: pids .*attempt 2: pids"):
            w.assert_never_together()
        assert w.attempts_seen(run_dir) == {1, 2}
    finally:
        for p in procs:
            p.kill()
            p.wait()


# Installed into the scheduler's interpreter (a sitecustomize on its PYTHONPATH): the 10th job
# submitted to APScheduler's thread pool (a few seconds after the start) sends the process SIGTERM
# while it holds the pool's lock, as a signal arriving inside ThreadPoolExecutor.submit does.
SIGNAL_INSIDE_SUBMIT = '''
import concurrent.futures.thread as pool
import os
import signal
import time

_submit = pool.ThreadPoolExecutor.submit
_count = [0]


def submit(self, fn, /, *args, **kwargs):
    _count[0] += 1
    if _count[0] == 10:
        with self._shutdown_lock:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)  # the handler runs while the lock is held
    return _submit(self, fn, *args, **kwargs)


pool.ThreadPoolExecutor.submit = submit
'''


def test_sigterm_while_the_job_pool_holds_its_lock_still_stops_the_scheduler(product: Product, tmp_path: Path) -> None:
    """Seen in CI 39: a scheduler sent SIGTERM did not stop in 30 s. Its handler shut APScheduler
    down on the main thread, which was inside the thread pool's submit (its tick, lease and system
    jobs go through it several times a second) holding the pool's lock: the shutdown waited for
    that lock for ever. The handler now only notes the signal; the main thread stops the scheduler
    outside it."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SIGNAL_INSIDE_SUBMIT)
    product.env["PYTHONPATH"] = os.pathsep.join([str(hook), product.env.get("PYTHONPATH", "")])
    scheduler = product.start_scheduler()
    try:
        assert scheduler.wait(60) == 0
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
    log = (product.home / "scheduler-0.log").read_text()
    assert "received SIGTERM; scheduler stopping" in log, log[-2000:]
