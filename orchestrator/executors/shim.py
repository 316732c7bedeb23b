"""A tiny launcher wrapper: ``python -m orchestrator.executors.shim --exit-file F -- ARGV...``.

The scheduler starts this in a new process session; it runs ARGV (torchrun) as its child,
waits, and writes the exit code to F atomically. A local run of several nodes gives one argv per
node instead (``--nodes-json '[[...], [...]]' --grace-s S``): the shim starts every node's
torchrun agent and ends the group as ``srun --kill-on-bad-exit`` would: when one agent fails,
the others get SIGTERM and, ``S`` seconds later, SIGKILL; the exit code recorded is the first
failure's. The exit code thus survives a scheduler
restart (a restarted scheduler is not the parent and cannot ``wait()``), and "exited with a code"
can be told apart from "vanished" (no exit file: killed with the whole group, or host reboot).

Before it starts torchrun it writes ``launch.json`` beside F with its own pid and create time,
and rewrites it with torchrun's right after the spawn. A scheduler that died between starting
the shim and committing its pid to the database adopts the attempt from that record instead of
calling it vanished and launching the run a second time.

The exit file survives storage faults where it can: its temporary file is written at the start
(a page of spaces) and overwritten in place at the end, which needs no new block on a full disk;
a write that still fails (a read-only mount, a deleted folder) is tried again every second for
``RUNYARD_EXIT_RETRY_S`` seconds (default 30), and the record then carries the first error
(``storage_error``: path, errno, message), so a folder read-only for a moment ends as a ``DISK``
failure naming it instead of a vanished launcher. A shim that never could write exits 75
(EX_TEMPFAIL); the scheduler, finding no exit file, probes the folder itself
(orchestrator/scheduler/outcomes.py).

It ignores SIGTERM/SIGINT/SIGHUP so that a signal to the process group reaches torchrun, which
forwards it to the ranks, while the shim stays to record how torchrun ended. torchrun gets
SIGKILL from the kernel if the shim dies (``PR_SET_PDEATHSIG``), and its ranks in turn die with
it (trainer/process/pdeathsig.py): killing the shim ends the whole attempt instead of leaving it
training unsupervised.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from db.vocabulary.layout import LAUNCH_RECORD
from trainer.process import pdeathsig


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync and rename."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def reserve(path: str, size: int = 4096, suffix: str = ".tmp") -> None:
    """Write ``path``'s temporary file (``path`` + ``suffix``) now, ``size`` spaces, so that
    :func:`write_reserved` can overwrite it in place later, on a disk that may be full by then.
    A failure is left to that later write."""
    try:
        with open(f"{path}{suffix}", "wb") as f:
            f.write(b" " * size)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        pass


def write_reserved(path: str, text: str, suffix: str = ".tmp") -> None:
    """Write ``text`` to ``path`` atomically, into the temporary file :func:`reserve` made when
    it is there and large enough (padded with spaces, which JSON ignores), else a new one."""
    tmp = f"{path}{suffix}"
    data = text.encode()
    try:
        size = os.path.getsize(tmp)
    except OSError:
        size = -1
    if size < len(data):
        write_atomic(path, text)
        return
    with open(tmp, "r+b") as f:
        f.write(data + b" " * (size - len(data)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


EXIT_RETRY_VAR = "RUNYARD_EXIT_RETRY_S"
EXIT_RETRY_S = 30.0
# The exit code of a shim that could not write its exit file (sysexits' EX_TEMPFAIL).
EXIT_UNWRITTEN = 75


def exit_retry_s() -> float:
    """How long a failing exit-file write is retried: RUNYARD_EXIT_RETRY_S, else EXIT_RETRY_S.

    Read without pydantic, as the shim of every attempt must start light: the variable is
    ``EnvSettings.exit_retry_s`` (db/vocabulary/settings.py, same default, a test keeps them equal), which the
    scheduler that started this shim checked at its own start."""
    try:
        return max(0.0, float(os.environ.get(EXIT_RETRY_VAR, EXIT_RETRY_S)))
    except ValueError:
        return EXIT_RETRY_S


def write_exit(path: str, record: dict[str, object], retry_s: float) -> bool:
    """Write the exit record, trying again every second for ``retry_s`` seconds while the storage
    refuses it; once a try failed, the record says so (``storage_error``). False when it never
    could."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            write_reserved(path, json.dumps(record))
            return True
        except OSError as exc:
            if "storage_error" not in record:
                record["storage_error"] = {"path": exc.filename or path, "errno": exc.errno,
                                           "message": str(exc), "at": time.time()}
                _say(f"[runyard shim] cannot write the exit file {path}: {exc}; trying again for {retry_s:.0f} s")
            if isinstance(exc, FileNotFoundError) or time.monotonic() >= deadline:  # a deleted folder stays so
                _say(f"[runyard shim] gave up writing the exit file {path}: {exc}")
                return False
        time.sleep(1.0)


def _say(line: str) -> None:
    """One line on stderr (the launcher log), which may fail too on the same storage."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


USAGE = ("usage: python -m orchestrator.executors.shim --exit-file FILE -- ARGV...\n"
         "       python -m orchestrator.executors.shim --exit-file FILE --nodes-json JSON [--grace-s S]")
# How often a group of nodes is looked at while every agent runs.
POLL_S = 0.2
# What the shim ignores so that a signal to the process group reaches torchrun, not it.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# The launch record's second version (with torchrun's pids) goes into a page of its own, taken
# before the first version is written: the disk may be full by the time torchrun has started.
LAUNCH_RESERVE = ".next"


def write_launch_record(path: str, torchrun: list[psutil.Process] | None = None) -> None:
    """Record this shim's pid and create time, and each torchrun agent's once it is started
    (``torchrun_pid`` is the first node's, ``node_pids`` every node's), the latter into the page
    reserved under LAUNCH_RESERVE."""
    me = psutil.Process()
    record: dict[str, object] = {"shim_pid": me.pid, "shim_create_time": me.create_time(), "written_at": time.time(),
                                 "torchrun_pid": None, "torchrun_create_time": None, "node_pids": []}
    if torchrun:
        record.update(torchrun_pid=torchrun[0].pid, torchrun_create_time=torchrun[0].create_time(),
                      node_pids=[p.pid for p in torchrun])
        write_reserved(path, json.dumps(record), LAUNCH_RESERVE)
    else:
        write_atomic(path, json.dumps(record))


def parse_args(argv: list[str]) -> tuple[str, list[list[str]], float] | None:
    """(exit file, one argv per node, grace seconds), or None when ``argv`` is not the usage."""
    if len(argv) >= 4 and argv[0] == "--exit-file" and argv[2] == "--":
        return argv[1], [argv[3:]], 0.0
    if len(argv) in (4, 6) and argv[0] == "--exit-file" and argv[2] == "--nodes-json":
        grace = 0.0
        if len(argv) == 6:
            if argv[4] != "--grace-s":
                return None
            try:
                grace = float(argv[5])
            except ValueError:
                return None
        try:
            nodes = json.loads(argv[3])
        except ValueError:
            return None
        if (isinstance(nodes, list) and nodes
                and all(isinstance(n, list) and n and all(isinstance(a, str) for a in n) for n in nodes)):
            return argv[1], nodes, grace
    return None


def main(argv: list[str]) -> int:
    parsed = parse_args(argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    exit_file, commands, grace_s = parsed
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    record = str(Path(exit_file).parent / LAUNCH_RECORD)
    # The pages of the exit file and of the launch record's second version first: once the
    # launch record exists (what the scheduler and the tests wait for), they are already taken,
    # whatever fills the disk after.
    reserve(exit_file)
    reserve(record, suffix=LAUNCH_RESERVE)
    write_launch_record(record)
    started = time.time()
    children = start_children(commands)
    try:
        write_launch_record(record, [psutil.Process(c.pid) for c in children])
    except psutil.NoSuchProcess:  # an agent already ended: the exit file below says how
        pass
    except OSError as exc:  # the storage failed past the reserved page: the shim's own pid is on record
        _say(f"[runyard shim] cannot record torchrun's pid in {record}: {exc}; the shim's pid stands for it")
    code, failed, nodes = wait_group(children, grace_s)
    ended: dict[str, object] = {"exit_code": code, "pid": failed.pid, "started_at": started, "ended_at": time.time()}
    if len(children) > 1:
        ended["nodes"] = nodes
    if not write_exit(exit_file, ended, exit_retry_s()):
        return EXIT_UNWRITTEN
    return code if code >= 0 else 128 - code


def wait_group(children: list[subprocess.Popen[bytes]],
               grace_s: float) -> tuple[int, subprocess.Popen[bytes], list[dict[str, Any]]]:
    """Wait for every node's agent; the first failure ends the others (SIGTERM, then SIGKILL
    after ``grace_s``: a node whose ranks are writing a checkpoint after a cancel gets to finish).

    Returns:
        The exit code to record (the first non-zero one, else 0), the agent it belongs to, and
        ``{"node", "pid", "exit_code"}`` of every node.
    """
    if len(children) == 1:
        code = children[0].wait()
        return code, children[0], [{"node": 0, "pid": children[0].pid, "exit_code": code}]
    first: subprocess.Popen[bytes] | None = None
    deadline: float | None = None
    while any(c.returncode is None for c in children):
        for child in children:
            if child.poll() is not None and child.returncode != 0 and first is None:
                first = child
                deadline = time.monotonic() + grace_s
                for other in children:
                    if other.returncode is None:
                        other.send_signal(signal.SIGTERM)
        if deadline is not None and time.monotonic() >= deadline:
            for other in children:
                if other.poll() is None:
                    other.kill()
            deadline = None  # sent once; the loop waits for them to be reaped
        time.sleep(POLL_S)
    nodes = [{"node": i, "pid": c.pid, "exit_code": c.returncode} for i, c in enumerate(children)]
    return (first.returncode, first, nodes) if first is not None else (0, children[0], nodes)


def start_children(commands: list[list[str]]) -> list[subprocess.Popen[bytes]]:
    """Start every node's agent with default handling of the stop signals, which the shim ignores.

    A child starts with the shim's ignored dispositions until its set-up restores them, and a
    SIGTERM that reached it in between (a cancel just after the launch, under load) was lost: the
    run stayed CANCELLING until the grace period's SIGKILL. The stop signals stay blocked from
    before the fork until the child's set-up has restored them, so such a signal waits and ends it
    (a blocked signal is never discarded, even while ignored); the shim then unblocks its own and
    drops them, as it ignores them.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        # preexec_fn is safe here: the shim has one thread.
        return [subprocess.Popen(command, restore_signals=True, preexec_fn=_child_setup(os.getpid()))  # noqa: PLW1509
                for command in commands]
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _child_setup(shim_pid: int) -> Callable[[], None]:
    """What runs in torchrun's process between fork and exec: default signal handling (then the
    stop signals unblocked: one that came since the fork ends the child here), and SIGKILL when
    the shim dies. Everything it calls is looked up before the fork."""
    prctl = pdeathsig.prctl_function()

    def setup() -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        if pdeathsig.set_pdeathsig(signal.SIGKILL, prctl) and os.getppid() != shim_pid:
            os._exit(1)  # the shim died before the signal was armed: torchrun must not start
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    return setup


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
