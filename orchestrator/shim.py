"""A tiny launcher wrapper: ``python -m orchestrator.shim --exit-file F -- ARGV...``.

The scheduler starts this in a new process session; it runs ARGV (torchrun) as its child,
waits, and writes the exit code to F atomically. The exit code thus survives a scheduler
restart (a restarted scheduler is not the parent and cannot ``wait()``), and "exited with a code"
can be told apart from "vanished" (no exit file: killed with the whole group, or host reboot).

It ignores SIGTERM/SIGINT/SIGHUP so that a signal to the process group reaches torchrun, which
forwards it to the ranks, while the shim stays to record how torchrun ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--exit-file" or argv[2] != "--":
        print("usage: python -m orchestrator.shim --exit-file FILE -- ARGV...", file=sys.stderr)
        return 2
    exit_file, command = argv[1], argv[3:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    started = time.time()
    # The child gets default signal handling back (ignored dispositions would be inherited).
    child = subprocess.Popen(command, restore_signals=True, preexec_fn=_reset_signals)
    code = child.wait()
    write_atomic(
        exit_file,
        json.dumps({"exit_code": code, "pid": child.pid, "started_at": started, "ended_at": time.time()}),
    )
    return code if code >= 0 else 128 - code


def _reset_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
