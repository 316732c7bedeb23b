"""Watching launched processes: liveness by pid and create time (never a recycled pid), exit
codes from the shim's exit file, and signalling a whole attempt's process tree.

torchrun starts every rank in a session of its own, so a signal to torchrun's process group
does not reach the ranks: the tree is walked, and processes that lost their parent are found by
the RUNYARD_RUN_DIR / RUNYARD_ATTEMPT they carry in their environment.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import psutil

from orchestrator.launcher import EXIT_FILE

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
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def read_exit(attempt_dir: Path) -> dict | None:
    """The shim's record of how the launcher ended, or None if it has not ended (or vanished)."""
    try:
        return json.loads((attempt_dir / EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None


def attempt_processes(
    run_dir: str, attempt: int, root_pid: int | None, root_create: float | None, orphans: bool = True
) -> list[psutil.Process]:
    """Every live process of one attempt: the launcher's tree plus, with ``orphans``, processes
    that lost their parent, found by the run directory (unique per data folder) and attempt
    number in their environment (that reads every process's environment: not for every tick)."""
    found: dict[int, psutil.Process] = {}
    if is_alive(root_pid, root_create):
        root = psutil.Process(root_pid)  # type: ignore[arg-type]
        found[root.pid] = root
        for child in root.children(recursive=True):
            found[child.pid] = child
    if not orphans:
        return list(found.values())
    want = {"RUNYARD_RUN_DIR": run_dir, "RUNYARD_ATTEMPT": str(attempt)}
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in found or proc.pid == os.getpid():
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if all(env.get(k) == v for k, v in want.items()):
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


def dump_stacks(
    run_dir: str, attempt: int, root_pid: int | None, root_create: float | None, attempt_dir: Path
) -> list[Path]:
    """Ask every rank for its Python stacks before anything is killed: SIGUSR1 (the trainer's
    faulthandler appends to ``stacks/rank-<r>.txt``), and ``py-spy dump`` when installed.

    A rank stopped with SIGSTOP cannot run its handler: it gets SIGCONT right after SIGUSR1, so
    it writes its stack before going on.
    """
    import shutil
    import subprocess

    folder = attempt_dir / "stacks"
    folder.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy")
    for proc in rank_processes(run_dir, attempt, root_pid, root_create):
        try:
            stopped = proc.status() == psutil.STATUS_STOPPED
            proc.send_signal(signal.SIGUSR1)
            if stopped:
                proc.send_signal(signal.SIGCONT)
        except psutil.Error:
            continue
        if py_spy:
            try:
                out = subprocess.run([py_spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=10)
                (folder / f"py-spy-{proc.pid}.txt").write_text(out.stdout + out.stderr)
            except (OSError, subprocess.SubprocessError) as exc:
                logger.warning("py-spy dump of %d failed: %s", proc.pid, exc)
    return sorted(folder.iterdir())
