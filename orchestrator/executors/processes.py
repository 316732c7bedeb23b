"""Watching launched processes: liveness by pid and create time (never a recycled pid), exit
codes from the shim's exit file, the shim's launch record, and signalling or ending a whole
attempt's processes.

torchrun starts every rank in a session of its own, so a signal to torchrun's process group
does not reach the ranks: the tree is walked, and processes that lost their parent are found by
the RUNYARD_RUN_DIR / RUNYARD_ATTEMPT they carry in their environment.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from db.vocabulary.layout import EXIT_FILE, LAUNCH_RECORD

logger = logging.getLogger(__name__)

CREATE_TIME_TOLERANCE_S = 0.05


def is_alive(pid: int | None, create_time: float | None) -> bool:
    """True when ``pid`` is running and is the process we launched (same create time)."""
    if pid is None or create_time is None:
        return False
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > CREATE_TIME_TOLERANCE_S:
            return False
        zombie: bool = proc.status() == psutil.STATUS_ZOMBIE  # psutil is untyped: its values are Any
        return not zombie
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def read_exit(attempt_dir: Path) -> dict[str, Any] | None:
    """The shim's record of how the launcher ended, or None if it has not ended (or vanished)."""
    try:
        record: dict[str, Any] | None = json.loads((attempt_dir / EXIT_FILE).read_text())
        return record
    except (OSError, ValueError):
        return None


def _tree(root_pid: int | None, root_create: float | None) -> dict[int, psutil.Process]:
    """The launcher and every descendant, when the launcher is the process we started."""
    found: dict[int, psutil.Process] = {}
    if root_pid is not None and is_alive(root_pid, root_create):
        try:
            root = psutil.Process(root_pid)
            found[root.pid] = root
            for child in root.children(recursive=True):
                found[child.pid] = child
        except psutil.Error:
            pass
    return found


def _carrying(run_dir: str, skip: set[int]) -> list[tuple[psutil.Process, str | None]]:
    """Every process whose environment names this run directory (unique per data folder), with
    the attempt number it carries. Reads every process's environment: not for every tick."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in skip or proc.pid == os.getpid():
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("RUNYARD_RUN_DIR") == run_dir:
            found.append((proc, env.get("RUNYARD_ATTEMPT")))
    return found


def attempt_processes(
    run_dir: str, attempt: int, root_pid: int | None, root_create: float | None, orphans: bool = True
) -> list[psutil.Process]:
    """Every live process of one attempt: the launcher's tree plus, with ``orphans``, processes
    that lost their parent, found by the run directory (unique per data folder) and attempt
    number in their environment (that reads every process's environment: not for every tick)."""
    found = _tree(root_pid, root_create)
    if orphans:
        for proc, number in _carrying(run_dir, set(found)):
            if number == str(attempt):
                found[proc.pid] = proc
    return list(found.values())


def signal_attempt(
    run_dir: str, attempt: int, root_pid: int | None, root_create: float | None, sig: signal.Signals
) -> int:
    """Send ``sig`` to every process of an attempt; returns how many were signalled.

    The shim at the root is spared (it ignores SIGTERM anyway): it stays to record the exit
    code, so a killed attempt still says how it ended.
    """
    procs = [p for p in attempt_processes(run_dir, attempt, root_pid, root_create) if p.pid != root_pid]
    sent = 0
    for proc in procs:
        try:
            proc.send_signal(sig)
            sent += 1
        except psutil.Error:
            continue
    logger.info("%s attempt %d: sent %s to %d process(es)", run_dir, attempt, sig.name, sent)
    return sent


def rank_processes(
    run_dir: str, attempt: int, root_pid: int | None, root_create: float | None, orphans: bool = True
) -> list[psutil.Process]:
    """The training processes of an attempt (those torchrun started: they carry LOCAL_RANK)."""
    ranks = []
    for proc in attempt_processes(run_dir, attempt, root_pid, root_create, orphans):
        try:
            if "LOCAL_RANK" in proc.environ():
                ranks.append(proc)
        except (psutil.Error, OSError):
            continue
    return ranks


def read_launch_record(attempt_dir: Path) -> dict[str, Any] | None:
    """The shim's record of its own pid and create time (and torchrun's), written before
    torchrun starts; None when the shim never got that far."""
    try:
        record = json.loads((attempt_dir / LAUNCH_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("shim_pid"), int):
        return None
    return record


@dataclass(frozen=True)
class Sweep:
    """What :func:`end_processes` did: how many it killed, and those still alive after the wait
    (each described as ``pid N (command line, state)``)."""

    killed: int
    survivors: list[str]

    @property
    def clean(self) -> bool:
        return not self.survivors


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid} ({' '.join(proc.cmdline())[:120]}, {proc.status()})"
    except psutil.Error:
        return f"pid {proc.pid}"


def _living(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those not yet gone. A zombie is gone: it holds no memory, GPU or file, only a table entry
    for its parent to read."""
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def end_processes(
    run_dir: str,
    root_pid: int | None = None,
    root_create: float | None = None,
    spare_attempt: int | None = None,
    wait_s: float = 2.0,
) -> Sweep:
    """SIGKILL every process of a run and wait (at most ``wait_s``) until they are gone.

    Found by the launcher's tree (``root_pid``, when it is still the process we started) and by
    the run directory in their environment, whatever attempt they belong to and whoever their
    parent now is: ranks orphaned by a killed agent, a script's own subprocesses. Only one
    attempt of a run may live at a time, so before an attempt is settled, and before its
    successor starts, nothing of the run may live.

    Args:
        run_dir: the run's directory, as given to its processes in RUNYARD_RUN_DIR.
        root_pid: the attempt's launcher (the shim), when known.
        root_create: the launcher's create time.
        spare_attempt: leave this attempt's processes alone (a cancel stops the newest attempt
            gracefully and sweeps only the older ones).
        wait_s: how long to wait for the killed processes to disappear.
    """
    tree = _tree(root_pid, root_create) if spare_attempt is None else {}
    procs = list(tree.values())
    procs += [proc for proc, number in _carrying(run_dir, set(tree))
              if spare_attempt is None or number != str(spare_attempt)]
    procs = _living(procs)
    killed = 0
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        except psutil.Error:
            continue
    deadline = time.monotonic() + wait_s
    alive = _living(procs)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = _living(alive)
    if killed:
        logger.info("%s: SIGKILL sent to %d process(es); %d still alive", run_dir, killed, len(alive))
    return Sweep(killed=killed, survivors=[_describe(p) for p in alive])
