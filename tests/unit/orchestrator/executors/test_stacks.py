"""Stack dumps taken off the tick (orchestrator/executors/stacks.py).

The dump test launches a small stand-in for torchrun through ``Scheduler(command=...)``: it
starts two "ranks" in sessions of their own, with LOCAL_RANK and RANK set and faulthandler on
SIGUSR1, as the trainer does. py-spy is replaced by a script that sleeps (a py-spy that takes
long on a large process), so that the test can see the tick go on while a dump is in flight.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Event
from db.vocabulary.config import RunConfig
from db.vocabulary.settings import Settings
from orchestrator.executors import stacks
from orchestrator.executors.processes import rank_processes
from orchestrator.scheduler.loop import Scheduler
from tests.conftest import wait_until
from tests.unit.orchestrator.fake_runs import CPU2, attempts, queue, status, tick_until
from tests.unit.paths import ROOT

# -- dumps off the tick ------------------------------------------------------------------------

# A stand-in for torchrun: two ranks in sessions of their own, each with faulthandler on SIGUSR1.
AGENT = textwrap.dedent("""
    import os, subprocess, sys, time
    rank_code = '''
    import faulthandler, os, signal, time
    folder = os.path.join(os.environ["RUNYARD_ATTEMPT_DIR"], "stacks")
    os.makedirs(folder, exist_ok=True)
    out = open(os.path.join(folder, "rank-" + os.environ["RANK"] + ".txt"), "a")
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
    open(os.path.join(folder, "up-" + os.environ["RANK"]), "w").close()
    time.sleep(120)
    '''
    for r in (0, 1):
        env = dict(os.environ, LOCAL_RANK=str(r), RANK=str(r))
        subprocess.Popen([sys.executable, "-c", rank_code], env=env, start_new_session=True)
    time.sleep(120)
""")


def fake_torchrun(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path,
                  **_: object) -> list[str]:
    return [sys.executable, "-c", AGENT]


def slow_py_spy(folder: Path) -> Path:
    folder.mkdir()
    tool = folder / "py-spy"
    tool.write_text(f'#!/bin/sh\necho "$$" >> "{folder / "started"}"\nexec sleep 60\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return folder


def test_a_hang_dump_runs_off_the_tick_and_the_kill_waits_for_it(
    sessions: sessionmaker[Session], settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = slow_py_spy(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(stacks, "PY_SPY_TIMEOUT_S", 3.0)
    run_id = queue(sessions, settings, "hung", nproc=2, supervision={"hang_timeout_s": 1, "hang_step_factor": 1})
    scheduler = Scheduler(sessions, settings, CPU2, command=fake_torchrun)
    scheduler.tick()
    (attempt,) = attempts(sessions, run_id)
    folder = Path(attempt.dir) / "stacks"
    tick_until(scheduler, lambda: (folder / "up-0").exists() and (folder / "up-1").exists())
    (rank1,) = [p for p in rank_processes(str(Path(attempt.dir).parents[1]), 1, attempt.pid, attempt.pid_create_time)
                if p.environ()["RANK"] == "1"]
    rank1.send_signal(signal.SIGSTOP)  # rank 1 alone stops
    with sessions() as s:  # rank 0 reported step 5, then nothing for a minute
        s.execute(update(Attempt).where(Attempt.id == attempt.id)
                  .values(first_step_at=time.time() - 70, progress_at=time.time() - 60, last_step=5))
        s.commit()

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def dumping() -> bool:
        """Both ranks' (fake) py-spy started and one of them is still running."""
        started = (tools / "started").read_text().split() if (tools / "started").exists() else []
        return len(started) == 2 and any(running(int(pid)) for pid in started)

    slowest = 0.0
    returned_while_dumping = 0
    began = time.monotonic()
    while time.monotonic() - began < 30:
        t = time.monotonic()
        scheduler.tick()
        slowest = max(slowest, time.monotonic() - t)
        returned_while_dumping += dumping()
        (attempt,) = attempts(sessions, run_id)
        if attempt.signal_sent == "SIGKILL":
            break
        time.sleep(0.1)
    killed_after = time.monotonic() - began
    assert attempt.signal_sent == "SIGKILL"
    # Off the tick: ticks came back while the dumps still ran, and none took as long as a dump's
    # timeout (a tick that waited for one would). Not a bound on a tick's time under load: CI once
    # saw one tick of 2.4 s on a loaded machine against a former bound of 1 s.
    assert returned_while_dumping >= 2, f"only {returned_while_dumping} ticks came back while the dumps ran"
    assert slowest < stacks.PY_SPY_TIMEOUT_S, f"a tick took {slowest:.1f} s: it waited for the dump"
    assert killed_after >= 3.0, "the attempt was killed before its stack dump finished"
    assert len((tools / "started").read_text().split()) == 2  # both ranks' py-spy ran, side by side
    assert attempt.failed_rank == 1
    assert "File " in (folder / "rank-0.txt").read_text() and "File " in (folder / "rank-1.txt").read_text()
    with sessions() as s:
        message = s.scalars(select(Event.message).where(Event.kind == "stacks")).one()
    assert "rank 1 was stopped (process state T)" in message and "saved in" in message
    tick_until(scheduler, lambda: status(sessions, run_id) in ("FAILED", "RETRYING"))
    assert attempts(sessions, run_id)[0].cause == "HANG"
    scheduler.close()


# -- only a rank with runyard's handler gets SIGUSR1 --------------------------------------------

# A plain script's rank: no handler for SIGUSR1, whose default action would kill it.
PLAIN_RANK = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"

# A rank that registered runyard's stack dumps, as trainer/__main__.py and the SDK do.
SDK_RANK = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from trainer.process.lifecycle import register_stack_dumps
    register_stack_dumps(Path(sys.argv[1]), 0)
    print('up', flush=True)
    time.sleep(60)
""")


def _rank(code: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "up"
    return child


@pytest.mark.parametrize("with_py_spy", [False, True])
def test_a_plain_script_rank_survives_a_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             with_py_spy: bool) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    if with_py_spy:  # a py-spy that prints a stack
        (tools / "py-spy").write_text('#!/bin/sh\necho "Thread 1 (idle): MainThread"\n')
        (tools / "py-spy").chmod(0o755)
    monkeypatch.setattr(stacks, "py_spy_path", lambda: str(tools / "py-spy") if with_py_spy else None)
    child = _rank(PLAIN_RANK)
    try:
        assert not stacks.has_stack_handler(child.pid, 0, tmp_path / "attempt" / "stacks")
        assert stacks._catches_sigusr1(child.pid) is False  # /proc: SIGUSR1 would kill it
        monkeypatch.setattr(stacks, "rank_processes", lambda *_: [psutil.Process(child.pid)])
        dump = stacks.dump_stacks("run", 1, child.pid, None, tmp_path / "attempt")
        time.sleep(0.2)
        assert child.poll() is None, "the dump killed a rank that has no handler for SIGUSR1"
        (rank,) = dump.ranks
        if with_py_spy:
            assert "MainThread" in rank.text and rank.note == ""
        else:
            assert rank.text == "" and "pip install py-spy" in rank.note
            assert "pip install py-spy" in (dump.folder / "rank-0-not-taken.txt").read_text()
            assert "could not be taken" in dump.summary()
        assert not (dump.folder / "rank-0.txt").exists()
    finally:
        child.kill()
        child.wait()


def test_a_rank_with_the_handler_writes_its_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacks, "py_spy_path", lambda: None)
    child = _rank(SDK_RANK, str(tmp_path / "attempt"))
    try:
        assert stacks.has_stack_handler(child.pid, 0, tmp_path / "attempt" / "stacks")
        assert stacks._catches_sigusr1(child.pid) is True
        monkeypatch.setattr(stacks, "rank_processes", lambda *_: [psutil.Process(child.pid)])
        dump = stacks.dump_stacks("run", 1, child.pid, None, tmp_path / "attempt")
        assert child.poll() is None
        (rank,) = dump.ranks
        assert "File " in rank.text and rank.note == ""
        assert "File " in (dump.folder / "rank-0.txt").read_text()
    finally:
        child.kill()
        child.wait()


# A rank that trains on one core when it is let run, with threads enough that its stacks take
# about 40 kB (each thread waits 30 calls deep): its dump is many writes, as a real rank's is.
THREADS = 20

BUSY_RANK = textwrap.dedent("""
    import sys, threading
    from pathlib import Path
    from trainer.process.lifecycle import register_stack_dumps
    register_stack_dumps(Path(sys.argv[1]), 0)
    THREADS = int(sys.argv[2])
    done, there = threading.Event(), threading.Semaphore(0)
    def deep(n):
        if n:
            return deep(n - 1)
        there.release()
        done.wait()
    for _ in range(THREADS):
        threading.Thread(target=deep, args=(30,), daemon=True).start()
    for _ in range(THREADS):
        there.acquire()  # every thread waits 30 calls deep
    def train_forever():
        print('up', flush=True)  # from inside: stopped any time after this, its frame is in the dump
        x = 0
        while True:
            x += 1
    train_forever()
""")


def test_a_stopped_rank_is_stopped_again_only_after_its_whole_stack_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped rank gets SIGCONT to write its stacks, then SIGSTOP again. On a loaded machine the
    rank can wait for a core in the middle of its dump; stopped again then, its stacks end before
    the frames of its training loop (CI 58). Here the rank runs at nice 19 on one core that a
    busy loop holds, so its dump crawls over many scheduler slices (about 2 s; it took the old
    wait 0.4 s to cut it short): the dump must still be whole (the main thread's frames come
    last) when the rank is stopped again."""
    monkeypatch.setattr(stacks, "FAULTHANDLER_WAIT_S", 30.0)  # the wait ends on the dump, not on this
    folder = tmp_path / "attempt" / "stacks"
    child = _rank(BUSY_RANK, str(tmp_path / "attempt"), str(THREADS))
    hog = None
    try:
        child.send_signal(signal.SIGSTOP)
        proc = psutil.Process(child.pid)
        wait_until(lambda: proc.status() == psutil.STATUS_STOPPED, 10)
        core = min(os.sched_getaffinity(0))
        for thread in proc.threads():  # set while stopped: a starved rank would take long to stop
            os.sched_setaffinity(thread.id, {core})
            os.setpriority(os.PRIO_PROCESS, thread.id, 19)
        busy = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
        hog = subprocess.Popen([sys.executable, "-c", busy])
        time.sleep(0.2)  # the busy loop holds the core

        stopped, texts = stacks._faulthandler({0: proc}, folder)
        assert stopped == {0: True}
        assert "train_forever" in texts[0] and texts[0].rstrip().endswith("in <module>"), texts[0][-300:]
        assert texts[0].count("in deep") == THREADS * 31
        hog.kill()
        wait_until(lambda: proc.status() == psutil.STATUS_STOPPED, 10)  # stopped again, as it was found
    finally:
        for p in (hog, child):
            if p is not None:
                p.kill()
                p.wait()


def test_the_real_py_spy_reads_a_stopped_plain_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGSTOPped rank of a plain script (the hung one): py-spy cannot suspend it, so runyard
    reads it with --nonblocking, and its own stack is in the dump."""
    py_spy = stacks.py_spy_path()
    if py_spy is None:
        pytest.skip("py-spy is not installed (the debug extra)")
    child = _rank(PLAIN_RANK)
    try:
        probe = subprocess.run([py_spy, "dump", "--pid", str(child.pid)], capture_output=True, text=True, timeout=30)
        if probe.returncode != 0:
            pytest.skip(f"py-spy cannot read processes here (ptrace refused?): {probe.stdout}{probe.stderr}")
        monkeypatch.setattr(stacks, "rank_processes", lambda *_: [psutil.Process(child.pid)])
        os.kill(child.pid, signal.SIGSTOP)
        # Stopped once it has run to take the signal: on a loaded machine that is not at once (CI 59).
        # A hung rank the scheduler dumps was stopped long before.
        wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_STOPPED, 10)
        dump = stacks.dump_stacks("run", 1, child.pid, None, tmp_path / "attempt")
        (rank,) = dump.ranks
        assert rank.stopped and psutil.Process(child.pid).status() == psutil.STATUS_STOPPED  # left as found
        assert "Failed to" not in rank.text and "<module>" in rank.text, rank.text
    finally:
        child.kill()
        child.wait()
