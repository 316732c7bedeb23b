"""Runs the scheduler launches as small Python programs instead of torchrun, for the unit tests
that drive its loop by calling ``tick()``: a real process under the real shim, in its own
session, so that admission and supervision are exercised in a second or two. The run's name
chooses what the program does (``BEHAVIOUR``). And a stray: a process of an attempt that no
process tree leads to, found only by its environment, as a rank that outlived its agent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Run
from db.vocabulary.config import RunConfig, parse_config
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.scheduler.loop import Scheduler
from orchestrator.submission import submit

CPU2 = Inventory(kind="cpu", slots=2)

# Behaviour of the fake workload, chosen by run name: sleep seconds, exit code, ignore SIGTERM.
PROGRAM = """
import signal, sys, time
seconds, code, stubborn = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
if stubborn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(seconds)
sys.exit(code)
"""

BEHAVIOUR = {
    "quick": ("0.3", "0", "0"),
    "fails": ("0.3", "3", "0"),
    "long": ("60", "0", "0"),
    "stubborn": ("60", "0", "1"),
    "medium": ("4", "0", "0"),
}


def fake_command(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path,
                 **_: object) -> list[str]:
    return [sys.executable, "-c", PROGRAM, *BEHAVIOUR[config.name]]


def make_scheduler(sessions: sessionmaker[Session], settings: Settings) -> Scheduler:
    return Scheduler(sessions, settings, CPU2, command=fake_command)


def queue(sessions: sessionmaker[Session], settings: Settings, name: str, nproc: int = 1, **sections: dict) -> int:
    config = parse_config({"name": name, "launch": {"nproc_per_node": nproc}, **sections})
    return submit(sessions, settings, config, CPU2)


def status(sessions: sessionmaker[Session], run_id: int) -> str:
    with sessions() as s:
        return s.get_one(Run, run_id).status


def attempts(sessions: sessionmaker[Session], run_id: int) -> list[Attempt]:
    with sessions() as s:
        return list(s.scalars(select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.number)))


def tick_until(scheduler: Scheduler, done: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        scheduler.tick()
        if done():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


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
