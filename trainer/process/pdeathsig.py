"""Die with the parent: ``PR_SET_PDEATHSIG`` through ``prctl`` (Linux).

torchrun starts every rank in a session of its own, so when torchrun's agent is killed (the OOM
killer, a stray ``kill -9``) nothing tells the ranks: they would keep training beside the retry
the scheduler launches. With the parent-death signal armed, the kernel sends SIGKILL to a rank
the moment its agent dies (and to the agent when runyard's launcher shim dies).

The signal fires when the *thread* that created the process exits; torchrun and the shim start
their children from their main thread, whose end is the process's end.

Where the kernel does not offer it (not Linux, no libc), :func:`arm` returns False and the
scheduler's sweep by environment (orchestrator/executors/processes.py) still finds the orphans.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def prctl_function() -> Callable[..., int] | None:
    """libc's ``prctl``, or None where there is none. Look it up before a ``fork`` when it is
    to be called in the child (``preexec_fn``): nothing is loaded after the fork then."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # the process's own libc, no search
    except (OSError, AttributeError):
        return None


def set_pdeathsig(sig: int, prctl: Callable[..., int] | None = None) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``; False where it is not offered or refused."""
    prctl = prctl or prctl_function()
    if prctl is None:
        return False
    return prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0


def arm(parent_pid: int | None = None, sig: signal.Signals = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies.

    Args:
        parent_pid: the parent this process must still have. ``None``: the parent at the time of
            the call (read before ``prctl``). Either way, a parent that died before ``prctl``
            took effect would never fire the signal, so this process exits at once (code 1)
            when it finds itself reparented.
        sig: the signal to receive.

    Returns:
        True when armed; False where the kernel does not offer it (nothing else happens then).
    """
    expected = os.getppid() if parent_pid is None else parent_pid
    if not set_pdeathsig(int(sig)):
        return False
    if os.getppid() != expected:
        # The parent died before the signal was armed: nobody will ever send it.
        logger.error("parent %d is gone (now %d): exiting rather than running as an orphan", expected, os.getppid())
        os._exit(1)
    return True


def arm_under_agent() -> bool:
    """For a rank under runyard: die with torchrun's agent (SIGKILL).

    The agent is this process's parent and carries the same ``RUNYARD_ATTEMPT`` and
    ``RUNYARD_RUN_DIR``. A rank whose parent is not such a process was orphaned before it got
    here (its agent already died): it exits at once. Outside runyard nothing is done.
    """
    run_dir, attempt = os.environ.get("RUNYARD_RUN_DIR"), os.environ.get("RUNYARD_ATTEMPT")
    if not run_dir or not attempt:
        return False
    parent = os.getppid()
    if not _same_attempt(parent, run_dir, attempt):
        logger.error("torchrun's agent is gone (parent is now pid %d): exiting rather than train as an orphan", parent)
        os._exit(1)
    return arm(parent)


def _same_attempt(pid: int, run_dir: str, attempt: str) -> bool:
    """True when process ``pid`` carries this run directory and attempt number (or cannot be
    read: only a positive sign of another process counts against it)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return True  # no /proc, or not readable: no evidence of orphanhood
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return env.get(b"RUNYARD_RUN_DIR") == run_dir.encode() and env.get(b"RUNYARD_ATTEMPT") == attempt.encode()
