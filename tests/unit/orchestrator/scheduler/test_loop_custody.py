"""No process lost track of, without torchrun: the shim's launch record, adoption from it, the
sweep of a run's processes by their environment, cancel reaching every attempt, the
parent-death signal, the script entry module, and an agent killed from outside counted as a
failure.

The "attempts" here are small Python programs under the real shim (launched through
``Scheduler(command=...)``), and their "orphans" are real processes in sessions of their own
that carry the attempt's environment, as torchrun's ranks do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Event, Run, RunStatusHistory
from db.requests import create_run, request_cancel
from db.states import AttemptStatus, RunStatus
from db.vocabulary.config import RunConfig, parse_config
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.executors import sweeper as sweeper_module
from orchestrator.executors.launcher import launch, torchrun_argv
from orchestrator.executors.processes import Sweep, end_processes, read_launch_record
from orchestrator.scheduler.loop import LAUNCH_LOST_S, Scheduler
from orchestrator.scheduler.outcomes import settle
from tests.unit.test_scheduler import CPU2, attempts, queue, status, tick_until

# Attempt N of a run named NAME does what BEHAVIOUR[NAME][N - 1] says (the last entry for later
# attempts): "sleep" (60 s), "fail" (exit 3), or "orphan-fail" (leave a process in a session of
# its own that keeps sleeping, then exit 3, like ranks that outlive a killed torchrun agent).
PROGRAM = textwrap.dedent("""
    import os, subprocess, sys, time
    what = sys.argv[1]
    if what == "orphan-fail":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        with open("orphan.pid", "w") as f:
            f.write(str(child.pid))
        sys.exit(3)
    if what == "fail":
        sys.exit(3)
    print("ready", flush=True)
    time.sleep(60)
""")
BEHAVIOUR = {"sleeper": ["sleep"], "orphaner": ["orphan-fail", "sleep"], "fail-then-sleep": ["fail", "sleep"]}


def command(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path, **_: object) -> list[str]:
    steps = BEHAVIOUR[config.name]
    return [sys.executable, "-c", PROGRAM, steps[min(attempt, len(steps)) - 1]]


def scheduler_for(sessions: sessionmaker[Session], settings: Settings) -> Scheduler:
    return Scheduler(sessions, settings, CPU2, command=command)


def stray(run_dir: str, attempt: int) -> subprocess.Popen:
    """A process of ``attempt`` that nobody's tree leads to (its own session, no parent of ours
    in the attempt), found only by its environment."""
    env = {**os.environ, "RUNYARD_RUN_DIR": run_dir, "RUNYARD_ATTEMPT": str(attempt), "LOCAL_RANK": "0"}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def run_dir_of(sessions: sessionmaker[Session], run_id: int) -> str:
    with sessions() as s:
        return s.get(Run, run_id).run_dir


def events(sessions: sessionmaker[Session], run_id: int) -> list[str]:
    with sessions() as s:
        return list(s.scalars(select(Event.message).where(Event.run_id == run_id).order_by(Event.id)))


# -- the launch record ------------------------------------------------------------------------


def test_the_shim_records_itself_and_torchrun_and_takes_torchrun_with_it(tmp_path: Path) -> None:
    attempt_dir = tmp_path / "attempts" / "1"
    launched = launch([sys.executable, "-c", "import time; time.sleep(60)"], attempt_dir, tmp_path, {})
    try:
        deadline = time.monotonic() + 15
        record = read_launch_record(attempt_dir)
        while (record is None or record["torchrun_pid"] is None) and time.monotonic() < deadline:
            time.sleep(0.05)
            record = read_launch_record(attempt_dir)
        assert record is not None and record["shim_pid"] == launched.pid
        assert record["shim_create_time"] == pytest.approx(launched.create_time, abs=0.01)
        child = psutil.Process(record["torchrun_pid"])
        assert child.ppid() == launched.pid
        assert child.create_time() == pytest.approx(record["torchrun_create_time"], abs=0.01)
        os.kill(launched.pid, signal.SIGKILL)  # the shim dies: its child must not run on unsupervised
        launched.popen.wait(10)
        child.wait(10)  # TimeoutExpired if it lives on
    finally:
        end_processes(str(tmp_path), launched.pid, launched.create_time)


def test_a_cancel_that_reaches_torchrun_before_its_exec_still_ends_it() -> None:
    """The shim ignores SIGTERM, and its child holds that disposition from the fork until its
    set-up restores the default. A SIGTERM in between (a cancel just after the launch; seen under
    load in test_devices_are_counted_per_host, which then stayed CANCELLING for the 30 s grace) was
    lost. Here the child signals itself at that very moment; it must die of it, not run on."""
    program = textwrap.dedent("""
        import os, signal, sys
        from orchestrator.executors import shim
        for sig in shim.STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # as shim.main does
        real = shim._child_setup

        def cancelled_before_setup(shim_pid):
            setup = real(shim_pid)
            def run():
                os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's SIGTERM lands between fork and exec
                setup()
            return run

        shim._child_setup = cancelled_before_setup
        (child,) = shim.start_children([[sys.executable, "-c", "import time; time.sleep(15)"]])
        print(child.wait(timeout=60))
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=90,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(-signal.SIGTERM)  # ended by the SIGTERM, at once


def test_a_launch_record_that_is_missing_or_damaged_is_none(tmp_path: Path) -> None:
    assert read_launch_record(tmp_path) is None
    (tmp_path / "launch.json").write_text('{"shim_pid": "12')
    assert read_launch_record(tmp_path) is None
    (tmp_path / "launch.json").write_text('{"shim_pid": null}')
    assert read_launch_record(tmp_path) is None


# -- adoption ----------------------------------------------------------------------------------


def forget_pid(sessions: sessionmaker[Session], run_id: int, age_s: float) -> None:
    """What a scheduler that died between launch() and the commit leaves: pid IS NULL."""
    with sessions() as s:
        s.execute(Attempt.__table__.update().where(Attempt.run_id == run_id)
                  .values(pid=None, pid_create_time=None, started_at=time.time() - age_s))
        s.commit()


def test_a_launch_without_a_committed_pid_is_adopted_from_the_record(sessions: sessionmaker[Session],
                                                                      settings: Settings) -> None:
    run_id = queue(sessions, settings, "sleeper")
    first = scheduler_for(sessions, settings)
    first.tick()
    (attempt,) = attempts(sessions, run_id)
    shim_pid = attempt.pid
    tick_until(first, lambda: read_launch_record(Path(attempt.dir)) is not None
               and read_launch_record(Path(attempt.dir))["torchrun_pid"] is not None)
    forget_pid(sessions, run_id, age_s=LAUNCH_LOST_S + 10)  # long past the old "lost launch" limit
    second = scheduler_for(sessions, settings)
    for _ in range(3):
        second.tick()
    (attempt,) = attempts(sessions, run_id)
    assert attempt.status == AttemptStatus.RUNNING.value and status(sessions, run_id) == "STARTING"
    assert attempt.pid == shim_pid and psutil.Process(shim_pid).is_running()
    assert any(f"adopted pid {shim_pid} from" in m for m in events(sessions, run_id))


def test_a_lost_launch_without_a_record_is_swept_before_it_is_called_vanished(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    run_id = queue(sessions, settings, "sleeper", retry={"max_retries": 0})
    scheduler = scheduler_for(sessions, settings)
    scheduler.tick()
    (attempt,) = attempts(sessions, run_id)
    shim = psutil.Process(attempt.pid)
    tick_until(scheduler, lambda: len(shim.children()) == 1)
    (program,) = shim.children()
    rank = stray(attempt.dir.rsplit("/attempts/", 1)[0], 1)  # like a rank: out of the shim's tree
    shim.kill()  # the shim is gone and left no record
    shim.wait(5)
    (Path(attempt.dir) / "launch.json").unlink()
    forget_pid(sessions, run_id, age_s=LAUNCH_LOST_S + 10)
    tick_until(scheduler, lambda: status(sessions, run_id) == "FAILED")
    assert dead(program.pid)  # the shim's child died with it (PR_SET_PDEATHSIG)
    assert rank.wait(5) == -signal.SIGKILL  # found by its environment, killed before the attempt was settled
    (attempt,) = attempts(sessions, run_id)
    assert attempt.cause == "VANISHED"


# -- the sweep ---------------------------------------------------------------------------------


def test_an_orphan_of_a_failed_attempt_is_killed_before_it_is_settled_and_retried(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    run_id = queue(sessions, settings, "orphaner", retry={"max_retries": 1, "backoff_s": 0.1})
    scheduler = scheduler_for(sessions, settings)
    pid_file = Path(run_dir_of(sessions, run_id)) / "orphan.pid"
    tick_until(scheduler, lambda: pid_file.exists() and pid_file.read_text() != "")
    orphan = int(pid_file.read_text())
    # Settled, then retried: under load one tick can do both (the settle outlasts the 0.1 s
    # backoff), so the run is never seen RETRYING between ticks; its history says it was.
    tick_until(scheduler, lambda: attempts(sessions, run_id)[0].status != "RUNNING")
    assert dead(orphan)  # settled only once it was gone
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)
    assert [a.exit_code for a in attempts(sessions, run_id)][:1] == [3]
    with sessions() as s:
        moves = s.scalars(select(RunStatusHistory.to_status).where(RunStatusHistory.run_id == run_id)
                          .order_by(RunStatusHistory.id)).all()
    assert moves == ["QUEUED", "STARTING", "RETRYING", "STARTING"]


def test_a_stray_of_an_earlier_attempt_dies_before_the_next_attempt_starts(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    run_id = queue(sessions, settings, "fail-then-sleep", retry={"max_retries": 1, "backoff_s": 2})
    scheduler = scheduler_for(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, run_id) == "RETRYING")
    left = stray(run_dir_of(sessions, run_id), 1)  # appears during the backoff
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)
    left.wait(5)
    assert left.returncode == -signal.SIGKILL


def test_a_process_that_outlives_sigkill_holds_the_attempt(
    sessions: sessionmaker[Session], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process stuck in the kernel (state D) ignores SIGKILL until it leaves it; none can be made
    here, so the sweep's answer is faked for a few ticks."""
    run_id = queue(sessions, settings, "fail-then-sleep", retry={"max_retries": 1, "backoff_s": 0.1})
    scheduler = scheduler_for(sessions, settings)
    stuck = Sweep(killed=1, survivors=["pid 4242 (python -m trainer, disk-sleep)"])
    monkeypatch.setattr(sweeper_module, "end_processes", lambda *a, **k: stuck)
    scheduler.tick()
    (attempt,) = attempts(sessions, run_id)
    deadline = time.monotonic() + 10
    while not (Path(attempt.dir) / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(5):
        scheduler.tick()
    (attempt,) = attempts(sessions, run_id)
    assert attempt.status == "RUNNING" and status(sessions, run_id) == "STARTING"  # exited, not settled
    warnings = [m for m in events(sessions, run_id) if "still alive" in m]
    assert len(warnings) == 1 and "pid 4242 (python -m trainer, disk-sleep)" in warnings[0]
    monkeypatch.setattr(sweeper_module, "end_processes", lambda *a, **k: Sweep(killed=0, survivors=[]))
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)


def test_cancel_reaches_every_attempt_of_the_run(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = queue(sessions, settings, "fail-then-sleep", retry={"max_retries": 1, "backoff_s": 0.1})
    scheduler = scheduler_for(sessions, settings)
    tick_until(scheduler, lambda: len(attempts(sessions, run_id)) == 2)
    old = stray(run_dir_of(sessions, run_id), 1)  # attempt 1's, somehow still alive
    with sessions() as s:
        request_cancel(s, run_id)
        s.commit()
    scheduler.tick()
    old.wait(5)
    assert old.returncode == -signal.SIGKILL
    tick_until(scheduler, lambda: status(sessions, run_id) == "CANCELLED")


def test_the_sweep_finds_processes_by_environment_only_for_its_own_run(tmp_path: Path) -> None:
    mine, other = stray(str(tmp_path / "run-1"), 1), stray(str(tmp_path / "run-10"), 1)
    spared = stray(str(tmp_path / "run-1"), 2)
    try:
        deadline = time.monotonic() + 10  # the environment is readable once the child has exec'd
        while "RUNYARD_RUN_DIR" not in psutil.Process(mine.pid).environ() and time.monotonic() < deadline:
            time.sleep(0.02)
        sweep = end_processes(str(tmp_path / "run-1"), spare_attempt=2)
        assert sweep.clean and sweep.killed == 1
        assert mine.wait(5) == -signal.SIGKILL
        assert other.poll() is None and spared.poll() is None
    finally:
        for p in (mine, other, spared):
            p.kill()
            p.wait()


# -- the parent-death signal and the script entry ----------------------------------------------


def test_a_rank_dies_with_its_agent(tmp_path: Path) -> None:
    """A stand-in agent (carrying the attempt's environment, as torchrun does) starts a rank in a
    session of its own that arms the signal like trainer/__main__.py; the agent is SIGKILLed."""
    env = {**os.environ, "RUNYARD_RUN_DIR": str(tmp_path), "RUNYARD_ATTEMPT": "1", "PYTHONPATH": os.getcwd()}
    rank = ("import time, trainer.process.pdeathsig as p; armed = p.arm_under_agent(); "
            "open('armed', 'w').write(str(armed)); time.sleep(60)")
    agent_code = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {rank!r}], "
                  "start_new_session=True, cwd=sys.argv[1]); time.sleep(60)")
    agent = subprocess.Popen([sys.executable, "-c", agent_code, str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 15
        while not (tmp_path / "armed").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "armed").read_text() == "True"
        (child,) = psutil.Process(agent.pid).children()
        agent.kill()
        agent.wait()
        child.wait(5)  # not our child: psutil waits for it to vanish (TimeoutExpired if it lives on)
        assert not child.is_running()
    finally:
        end_processes(str(tmp_path), wait_s=1)


def test_a_rank_whose_agent_is_already_gone_does_not_start(tmp_path: Path) -> None:
    """Orphaned before it armed the signal (its parent is now not the attempt's agent): it exits."""
    env = {**os.environ, "RUNYARD_RUN_DIR": str(tmp_path), "RUNYARD_ATTEMPT": "1", "PYTHONPATH": os.getcwd()}
    code = "import trainer.process.pdeathsig as p; p.arm_under_agent(); print('trained as an orphan')"
    # Its parent here is this test process, which does not carry the attempt's environment.
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 1 and "trained as an orphan" not in result.stdout
    assert "agent is gone" in result.stderr


def test_the_script_entry_runs_a_script_as_python_would(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import helper  # a sibling module, found as `python train.py` would find it
        print(json.dumps({"name": __name__, "argv": sys.argv, "value": helper.VALUE}))
    """))
    result = subprocess.run([sys.executable, "-m", "trainer.process.script_runner", str(script), "--steps", "5"],
                            capture_output=True, text=True, timeout=30, cwd=os.getcwd(), check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"name": "__main__", "argv": [str(script), "--steps", "5"], "value": 42}


def test_the_script_entry_moves_into_the_workdir_after_runyards_imports(tmp_path: Path) -> None:
    """The user's folder holds modules named like runyard's packages (minGPT's trainer.py, a
    db.py): runyard's processes start elsewhere, and only the script sees the folder."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "trainer.py").write_text("OWN = True\n")
    (work / "db.py").write_text("raise SystemExit('the user db.py was imported by runyard')\n")
    (work / "pkg").mkdir()
    (work / "pkg" / "__init__.py").write_text("")
    (work / "pkg" / "train.py").write_text(textwrap.dedent("""
        import json, os, trainer
        print(json.dumps({"cwd": os.getcwd(), "own": getattr(trainer, "OWN", False)}))
    """))
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for target in (["-m", "pkg.train"], [str(work / "pkg" / "train.py")]):
        result = subprocess.run([sys.executable, "-m", "trainer.process.script_runner", "--workdir", str(work),
                                 *target],
                                capture_output=True, text=True, timeout=30, cwd=elsewhere, env=env, check=False)
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout)
        assert seen["cwd"] == str(work)
        assert seen["own"] is (target[0] == "-m")  # a script's folder (pkg/) has no trainer.py: runyard's


def test_a_script_launch_goes_through_the_entry_module() -> None:
    config = parse_config({"workload": {"kind": "script", "script": "/abs/train.py", "args": ["--lr", "1"]}})
    argv = torchrun_argv(config, 1, 1, 29500, Path("/tmp/a"))
    assert argv[-5:] == ["-m", "trainer.process.script_runner", "/abs/train.py", "--lr", "1"]
    config = parse_config({"workload": {"kind": "script", "module": "pkg.train", "workdir": "/w"}})
    assert torchrun_argv(config, 1, 1, 29500, Path("/tmp/a"))[-5:] == [
        "trainer.process.script_runner", "--workdir", "/w", "-m", "pkg.train"]


# -- an agent killed from outside --------------------------------------------------------------


def ended_attempt(sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, code: int,
                  stopped: bool) -> tuple[int, int]:
    with sessions() as s:
        run = create_run(s, RunConfig.model_validate({"name": "agent", "retry": {"max_retries": 3}}), settings.runs_dir,
                         Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.flush()
        run.status = RunStatus.RUNNING.value
        attempt_dir = tmp_path / f"attempt-{code}"
        attempt_dir.mkdir()
        (attempt_dir / "exit.json").write_text(json.dumps({"exit_code": code, "pid": 4242, "started_at": 1.0,
                                                           "ended_at": 2.0}))
        if stopped:  # the ranks got a SIGTERM and checkpointed before they died
            (attempt_dir / "stopped.json").write_text(json.dumps({"step": 50, "checkpoint_step": 50}))
        attempt = Attempt(run_id=run.id, number=1, status="RUNNING", dir=str(attempt_dir), started_at=0.0,
                          first_step_at=0.5, last_step=50)
        s.add(attempt)
        s.commit()
        return run.id, attempt.id


def settle_it(sessions: sessionmaker[Session], ids: tuple[int, int]) -> tuple[Attempt, Run]:
    run_id, attempt_id = ids
    with sessions() as s:
        run, attempt = s.get(Run, run_id), s.get(Attempt, attempt_id)
        settle(s, run, attempt, json.loads((Path(attempt.dir) / "exit.json").read_text()))
        s.commit()
        s.expunge_all()
        return attempt, run


def test_an_agent_killed_from_outside_spends_a_retry_even_if_its_ranks_checkpointed(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path
) -> None:
    attempt, run = settle_it(sessions, ended_attempt(sessions, settings, tmp_path, code=-9, stopped=True))
    assert attempt.cause == "SIGNAL" and attempt.retry_counted is True
    assert attempt.exception == "the torchrun agent (pid 4242) was killed by SIGKILL"
    assert run.status == "RETRYING" and run.retries_used == 1


def test_a_preemption_the_agent_survived_is_still_free(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path
) -> None:
    # SIGTERM from outside: torchrun stops its ranks, which checkpoint, and exits on its own (1).
    attempt, run = settle_it(sessions, ended_attempt(sessions, settings, tmp_path, code=1, stopped=True))
    assert attempt.cause == "PREEMPTED" and attempt.retry_counted is False
    assert run.status == "RETRYING" and run.retries_used == 0


@pytest.mark.parametrize("asked", ["cancel", "pause"])
def test_a_cancel_that_arrives_as_the_run_finishes_leaves_it_succeeded(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, asked: str
) -> None:
    """Step 50 of 50 done, the final save under way, then Cancel (or Pause): the ranks end on
    their own with 0 and no stop record. A finished run must not read CANCELLED at 50/50."""
    ids = ended_attempt(sessions, settings, tmp_path, code=0, stopped=False)
    with sessions() as s:
        run = s.get(Run, ids[0])
        stopping = RunStatus.PAUSING if asked == "pause" else RunStatus.CANCELLING
        run.max_steps, run.status, run.stop_mode = 50, stopping.value, asked
        s.get(Attempt, ids[1]).stop_reason = asked
        s.commit()
    attempt, run = settle_it(sessions, ids)
    assert (run.status, attempt.status) == ("SUCCEEDED", "SUCCEEDED")
    assert run.status_reason == f"all ranks finished (step 50/50) before the {asked} took effect"


def test_a_cancel_that_stops_the_ranks_before_the_last_step_cancels(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path
) -> None:
    ids = ended_attempt(sessions, settings, tmp_path, code=0, stopped=True)  # stopped at 50 with a checkpoint
    with sessions() as s:
        run = s.get(Run, ids[0])
        run.max_steps, run.status, run.stop_mode = 300, RunStatus.CANCELLING.value, "cancel"
        s.get(Attempt, ids[1]).stop_reason = "cancel"
        s.commit()
    attempt, run = settle_it(sessions, ids)
    assert (run.status, attempt.status) == ("CANCELLED", "CANCELLED")
    assert run.status_reason.startswith("cancelled at step 50 (with a checkpoint)")


@pytest.mark.parametrize(("status", "stop_mode", "ends"), [
    ("PAUSING", "pause", "PAUSED"),  # a pause carried out
    ("CANCELLING", "cancel", "CANCELLED"),  # a Cancel clicked while it was PAUSING: the SIGTERM went as a pause
])
def test_a_stopped_attempt_ends_the_run_as_the_last_request_says(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, status: str, stop_mode: str, ends: str
) -> None:
    ids = ended_attempt(sessions, settings, tmp_path, code=0, stopped=True)  # stopped at 50 with a checkpoint
    with sessions() as s:
        run = s.get(Run, ids[0])
        run.max_steps, run.status, run.stop_mode = 300, status, stop_mode
        s.get(Attempt, ids[1]).stop_reason = "pause"
        s.commit()
    attempt, run = settle_it(sessions, ids)
    assert (run.status, attempt.status) == (ends, ends)
    assert run.status_reason.startswith(f"{ends.lower()} at step 50 (with a checkpoint)")


def test_a_clean_pause_is_not_shown_as_torchruns_exit_1(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path
) -> None:
    """The ranks checkpointed on runyard's SIGTERM (stopped.json) and stopped; torchrun's agent got
    the SIGTERM too and exited 1. The attempt is PAUSED with exit code 0, the 1 explained."""
    ids = ended_attempt(sessions, settings, tmp_path, code=1, stopped=True)
    with sessions() as s:
        attempt = s.get(Attempt, ids[1])
        attempt.stop_reason, attempt.signal_sent = "pause", "SIGTERM"
        s.get(Run, ids[0]).status = "CANCELLING"  # what request_cancel(mode="pause") left
        s.commit()
    attempt, run = settle_it(sessions, ids)
    assert (attempt.status, attempt.exit_code, run.status) == ("PAUSED", 0, "PAUSED")
    assert "(with a checkpoint; torchrun's exit 1 was its answer to the SIGTERM)" in attempt.reason
