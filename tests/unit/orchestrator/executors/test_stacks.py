"""Stack dumps off the tick (orchestrator/executors/stacks.py), the rank a hang is blamed on, and the fault
hooks' switch (trainer/faults.py).

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
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Event
from db.vocabulary.config import RunConfig
from db.vocabulary.settings import Settings
from orchestrator.executors import stacks
from orchestrator.executors.local import LocalExecutor
from orchestrator.executors.processes import rank_processes
from orchestrator.executors.stack_reading import (
    Frame,
    RankStack,
    culprit,
    exception_in_locals,
    handler_frame,
    main_thread_frames,
)
from orchestrator.scheduler.loop import Scheduler
from tests.conftest import wait_until
from tests.unit.test_scheduler import CPU2, attempts, queue, status, tick_until
from trainer import faults
from trainer.checkpoint import CheckpointManager

# What faulthandler wrote for two gloo ranks of mlp-digits when rank 1 stalled before a step
# (RUNYARD_FAULT_STALL): rank 0 waits in DDP's backward, rank 1 sleeps in Python.
WAITING = """\
Thread 0x00007f6be7fff6c0 (most recent call first):
  File "/w/trainer/reporting/reporter.py", line 75 in _drain
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f6c0e285b80 (most recent call first):
  File "/w/.venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/w/.venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 395 in backward
  File "/w/trainer/workloads/mlp_digits.py", line 146 in train
  File "/w/.venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367 in wrapper
  File "/w/trainer/__main__.py", line 77 in <module>
"""  # noqa: E501 (faulthandler's lines, verbatim)
STALLED = """\
Current thread 0x00007f0ae1006b80 (most recent call first):
  File "/w/trainer/faults.py", line 116 in maybe_stall
  File "/w/trainer/workloads/mlp_digits.py", line 124 in train
  File "/w/.venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367 in wrapper
  File "/w/trainer/__main__.py", line 77 in <module>
"""  # noqa: E501 (faulthandler's lines, verbatim)
IN_ALL_REDUCE = """\
Thread 11851 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2950)
    train (ddp_plain.py:40)
"""


def test_the_one_rank_outside_the_collective_is_named() -> None:
    rank, why = culprit([RankStack(0, 10, False, WAITING), RankStack(1, 11, False, STALLED)])
    assert rank == 1
    assert why == ("rank 1 is outside any collective (maybe_stall at faults.py:116) while the other ranks wait "
                   "in one")
    assert culprit([RankStack(0, 10, False, STALLED), RankStack(1, 11, False, IN_ALL_REDUCE),
                    RankStack(2, 12, False, WAITING)])[0] == 0


def test_a_stopped_rank_is_named_before_the_stacks_are_read() -> None:
    rank, why = culprit([RankStack(0, 10, False, WAITING), RankStack(1, 11, True, WAITING)])
    assert rank == 1 and "stopped" in why


@pytest.mark.parametrize("ranks", [
    [RankStack(0, 10, False, WAITING), RankStack(1, 11, False, IN_ALL_REDUCE)],  # every rank waits
    [RankStack(0, 10, False, STALLED), RankStack(1, 11, False, STALLED)],  # nobody waits
    [RankStack(0, 10, False, WAITING), RankStack(1, 11, False, "")],  # one rank's stack is missing
    [RankStack(0, 10, True, STALLED), RankStack(1, 11, True, STALLED)],  # both stopped, neither waits
    [RankStack(0, 10, False, STALLED)],  # one rank alone: nothing to compare
])
def test_no_rank_is_named_when_the_evidence_does_not_single_one_out(ranks: list[RankStack]) -> None:
    assert culprit(ranks) == (None, "")


# -- a rank waiting inside its exception handler (issue 52, item 4) -----------------------------

# What py-spy showed of a Lightning rank under OnExceptionCheckpoint (Lightning #20187): the rank that
# raised saves from its handler, through a barrier, with --locals; lightning's frames as call.py has them.
LIGHTNING_LOCALS = """\
Thread 4242 (idle): "MainThread"
    barrier (/v/site-packages/torch/distributed/distributed_c10d.py:5356)
        Arguments:
            group: <torch._C._distributed_c10d.ProcessGroup at 0x7f2db1ad8670>
    barrier (/v/site-packages/lightning/pytorch/strategies/ddp.py:302)
    save_checkpoint (/v/site-packages/lightning/pytorch/trainer/trainer.py:1390)
        Arguments:
            self: <Trainer at 0x7f2d94c93bb0>
            filepath: "ckpts/on_exception.ckpt"
    on_exception (/v/site-packages/lightning/pytorch/callbacks/on_exception_checkpoint.py:68)
        Arguments:
            self: <OnExceptionCheckpoint at 0x7f2d94c93cc0>
            trainer: <Trainer at 0x7f2d94c93bb0>
            _: (<Regression at 0x7f2d94c93dd0>, <ValueError at 0x7f2d94c93ee0>)
    _call_callback_hooks (/v/site-packages/lightning/pytorch/trainer/call.py:228)
    _interrupt (/v/site-packages/lightning/pytorch/trainer/call.py:76)
        Arguments:
            exception: <ValueError at 0x7f2d94c93ee0>
    _call_and_handle_interrupt (/v/site-packages/lightning/pytorch/trainer/call.py:66)
    fit (/v/site-packages/lightning/pytorch/trainer/trainer.py:584)
"""
SCRIPT = """\
def main():
    try:
        train()
    except ValueError as exc:
        save()
        raise exc
"""


def test_a_frame_inside_an_except_block_or_lightning_s_handlers_is_a_handler_frame(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    assert handler_frame([Frame("barrier", "/v/torch/distributed/c10d.py", 9), Frame("main", str(script), 5)]) \
        == Frame("main", str(script), 5)
    assert handler_frame([Frame("main", str(script), 3)]) is None  # the try's body: every rank is there
    assert handler_frame([Frame("main", str(tmp_path / "gone.py"), 5)]) is None  # no source to read
    lightning = main_thread_frames(LIGHTNING_LOCALS)
    assert str(handler_frame(lightning)) == "on_exception at on_exception_checkpoint.py:68"
    # _call_and_handle_interrupt wraps fit on every rank: never a handler by its name.
    assert handler_frame([f for f in lightning if f.func in ("_call_and_handle_interrupt", "fit")]) is None
    assert exception_in_locals(LIGHTNING_LOCALS) == "ValueError"
    assert exception_in_locals(IN_ALL_REDUCE) is None


def test_the_rank_inside_its_exception_handler_is_named_with_its_exception() -> None:
    handler = Frame("on_exception", "/v/on_exception_checkpoint.py", 68)
    waiting = RankStack(0, 10, False, IN_ALL_REDUCE)
    raised = RankStack(1, 11, False, LIGHTNING_LOCALS, handler=handler, exception="ValueError")
    assert culprit([waiting, raised]) == (1, "rank 1 waits inside an exception handler (on_exception at "
                                             "on_exception_checkpoint.py:68): it raised ValueError and its handler "
                                             "waits for the other ranks, which wait elsewhere")
    # Every rank in a handler: no one rank raised alone (a stop signal reaches them all).
    assert culprit([replace(waiting, handler=handler), raised]) == (None, "")


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
        s.execute(Attempt.__table__.update().where(Attempt.id == attempt.id)
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
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", PYTHONPATH=str(Path(__file__).parents[2]))
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


# -- the fault hooks' switch -------------------------------------------------------------------


def test_fault_hooks_do_nothing_without_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RUNYARD_FAULT_RAISE": "1", "RUNYARD_FAULT_STEP_DELAY_S": "5",
                        "RUNYARD_FAULT_SAVE_DELAY": "1:5", "RUNYARD_FAULT_SLOW_RANK": "0:5",
                        "RUNYARD_FAULT_STALL": "1:0", "RUNYARD_FAULT_SIGKILL": "1:0",
                        "RUNYARD_FAULT_EXIT_AFTER_LAUNCH": "1", "RUNYARD_FAULT_ABORT_AT_EXIT": "0",
                        "RUNYARD_FAULT_CUDA_OOM": "1:0", "RUNYARD_FAULT_PERTURB": "1:0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RUNYARD_FAULTS", raising=False)
    assert not faults.enabled()
    injected = faults.StepFaults(rank=0, attempt=1)
    injected.before(1, batch_size=64)  # would raise, OOM, SIGKILL or stall with the switch on
    injected.after()
    faults.maybe_abort_at_exit(0)
    faults.maybe_perturb(1, 0, [])
    assert (faults.step_delay_s(), faults.save_delay_s(1), faults.slow_rank_s(0)) == (0.0, 0.0, 0.0)
    assert not faults.exit_after_launch()
    monkeypatch.setenv("RUNYARD_FAULTS", "1")
    assert faults.step_delay_s() == 5.0 and faults.exit_after_launch()
    with pytest.raises(RuntimeError, match="injected failure at step 1"):
        faults.maybe_raise(1, 0, 1)
    monkeypatch.setenv("RUNYARD_FAULTS", "yes")  # only "1" turns them on
    assert not faults.enabled()


def test_the_training_loop_gets_its_fault_hooks_only_under_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in loop asks for one hook object: None in real training (nothing is called),
    the hooks in runyard's tests, where the perturbation lands after the optimizer step it names."""
    monkeypatch.setenv("RUNYARD_FAULT_PERTURB", "3:0")
    monkeypatch.delenv("RUNYARD_FAULTS", raising=False)
    assert faults.StepFaults.installed(rank=0, attempt=1) is None
    monkeypatch.setenv("RUNYARD_FAULTS", "1")
    hooks = faults.StepFaults.installed(rank=0, attempt=1)
    assert hooks is not None
    param = torch.zeros(2)
    hooks.after_update(2, [param])
    assert param.tolist() == [0.0, 0.0]
    hooks.after_update(3, [param])
    assert param[0].item() == pytest.approx(1e-3) and param[1].item() == 0.0


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


def test_every_component_gets_its_fault_hooks_only_under_the_switch(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """The entry point, the checkpoint writer and the local executor each ask for one hook
    object, as the training loop does: None without the switch (a stray RUNYARD_FAULT_* in a
    user's shell reaches nothing), the hooks in runyard's tests."""
    monkeypatch.setenv("RUNYARD_FAULT_SAVE_DELAY", "2:0.3")
    monkeypatch.setenv("RUNYARD_FAULT_EXIT_AFTER_LAUNCH", "1")
    monkeypatch.setenv("RUNYARD_FAULT_SETUP_DELAY_S", "0.3")
    monkeypatch.delenv("RUNYARD_FAULTS", raising=False)
    assert faults.EntryFaults.installed(rank=0) is None
    assert faults.SaveFaults.installed() is None and faults.LaunchFaults.installed() is None
    assert CheckpointManager(tmp_path / "off")._faults is None and LocalExecutor()._faults is None
    monkeypatch.setenv("RUNYARD_FAULTS", "1")
    entry, save, launch = faults.EntryFaults.installed(rank=0), faults.SaveFaults.installed(), \
        faults.LaunchFaults.installed()
    assert entry is not None and save is not None and launch is not None
    assert CheckpointManager(tmp_path / "on")._faults is not None and LocalExecutor()._faults is not None
    assert launch.exit_after_launch()
    started = time.monotonic()
    save.before_publish(1)  # not the step it names: no wait
    assert time.monotonic() - started < 0.25
    save.before_publish(2)
    entry.during_setup()
    assert time.monotonic() - started >= 0.6
