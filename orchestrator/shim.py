"""A tiny launcher wrapper: ``python -m orchestrator.shim --exit-file F -- ARGV...``.

The scheduler starts this in a new process session; it runs ARGV (torchrun) as its child,
waits, and writes the exit code to F atomically. The exit code thus survives a scheduler
restart (a restarted scheduler is not the parent and cannot ``wait()``), and "exited with a code"
can be told apart from "vanished" (no exit file: killed with the whole group, or host reboot).

Before it starts torchrun it writes ``launch.json`` beside F with its own pid and create time,
and rewrites it with torchrun's right after the spawn. A scheduler that died between starting
the shim and committing its pid to the database adopts the attempt from that record instead of
calling it vanished and launching the run a second time.

It ignores SIGTERM/SIGINT/SIGHUP so that a signal to the process group reaches torchrun, which
forwards it to the ranks, while the shim stays to record how torchrun ended. torchrun gets
SIGKILL from the kernel if the shim dies (``PR_SET_PDEATHSIG``), and its ranks in turn die with
it (trainer/pdeathsig.py): killing the shim ends the whole attempt instead of leaving it
training unsupervised.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from db.layout import LAUNCH_RECORD
from trainer import pdeathsig


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync and rename."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_launch_record(path: str, torchrun: psutil.Process | None = None) -> None:
    """Record this shim's pid and create time, and torchrun's once it is started."""
    me = psutil.Process()
    record = {"shim_pid": me.pid, "shim_create_time": me.create_time(), "written_at": time.time(),
              "torchrun_pid": None, "torchrun_create_time": None}
    if torchrun is not None:
        record.update(torchrun_pid=torchrun.pid, torchrun_create_time=torchrun.create_time())
    write_atomic(path, json.dumps(record))


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--exit-file" or argv[2] != "--":
        print("usage: python -m orchestrator.shim --exit-file FILE -- ARGV...", file=sys.stderr)
        return 2
    exit_file, command = argv[1], argv[3:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    record = str(Path(exit_file).parent / LAUNCH_RECORD)
    write_launch_record(record)
    started = time.time()
    # The child gets default signal handling back (ignored dispositions would be inherited).
    # preexec_fn is safe here: the shim has one thread.
    child = subprocess.Popen(command, restore_signals=True, preexec_fn=_child_setup(os.getpid()))  # noqa: PLW1509
    try:
        write_launch_record(record, psutil.Process(child.pid))
    except psutil.NoSuchProcess:
        pass  # torchrun already ended: the exit file below says how
    code = child.wait()
    write_atomic(
        exit_file,
        json.dumps({"exit_code": code, "pid": child.pid, "started_at": started, "ended_at": time.time()}),
    )
    return code if code >= 0 else 128 - code


def _child_setup(shim_pid: int) -> Callable[[], None]:
    """What runs in torchrun's process between fork and exec: default signal handling, and
    SIGKILL when the shim dies. Everything it calls is looked up before the fork."""
    prctl = pdeathsig.prctl_function()

    def setup() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if pdeathsig.set_pdeathsig(signal.SIGKILL, prctl) and os.getppid() != shim_pid:
            os._exit(1)  # the shim died before the signal was armed: torchrun must not start

    return setup


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
