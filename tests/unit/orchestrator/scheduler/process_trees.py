"""A small process tree standing in for torchrun, and the fake clock the system monitor samples by,
for the system monitor's tests: a parent and two children carrying RANK and LOCAL_RANK, one
spinning (CPU), one holding memory (RSS), and a clock that moves 2 s per sample, so that a 10-s
window closes without waiting 10 s.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt
from db.requests import create_run
from db.states import AttemptStatus, RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.scheduler.sysmon import SAMPLE_S, SystemMonitor

START = 1_000_000.0  # a window boundary: samples at START, +2, ... +8 fall in one window

# The stand-in for torchrun: two "ranks" with RANK = offset + LOCAL_RANK; LOCAL_RANK 0 spins,
# LOCAL_RANK 1 holds 64 MB. It says "ready" once both are up; the test kills them all.
TREE = r"""
import os, subprocess, sys, time
offset = int(sys.argv[1])
spin = "import time\nprint('up', flush=True)\nend = time.time() + 120\nwhile time.time() < end: pass\n"
hold = ("import time\nblock = bytearray(64 * 2**20)\nfor i in range(0, len(block), 4096): block[i] = 1\n"
        "print('up', flush=True)\ntime.sleep(120)\n")
kids = []
for local, code in enumerate([spin, hold]):
    env = dict(os.environ, RANK=str(offset + local), LOCAL_RANK=str(local), WORLD_SIZE="2")
    kids.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True))
for k in kids:
    k.stdout.readline()  # up: the holder has touched its memory
print("ready", flush=True)
try:
    time.sleep(120)
finally:
    for k in kids:
        k.kill()
"""


class FakeClock:
    def __init__(self, start: float = START, step: float = SAMPLE_S):
        self.now, self.step = start - step, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@dataclass
class Tree:
    run_id: int
    parent: subprocess.Popen
    ranks: list[psutil.Process]


def start_tree(sessions: sessionmaker[Session], settings: Settings, devices: list[int], rank_offset: int = 0) -> Tree:
    """A RUNNING run whose attempt's launcher is a real process tree with two ranks."""
    config = RunConfig.model_validate({"name": "sysmon", "launch": {"nproc_per_node": 2}})
    with sessions() as s:
        run = create_run(s, config, settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.flush()
        assert transition(s, run.id, RunStatus.STARTING, "test")
        assert transition(s, run.id, RunStatus.RUNNING, "test")
        run_id, run_dir = run.id, run.run_dir
        s.commit()
    env = {"RUNYARD_RUN_DIR": run_dir, "RUNYARD_ATTEMPT": "1", "PATH": "/usr/bin:/bin"}
    parent = subprocess.Popen([sys.executable, "-c", TREE, str(rank_offset)], env=env, stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
    root = psutil.Process(parent.pid)
    deadline = time.monotonic() + 10
    ranks: list[psutil.Process] = []
    while time.monotonic() < deadline:  # until both children have exec'd with their RANK
        ranks = [c for c in root.children() if "RANK" in _environ(c)]
        if len(ranks) == 2:
            break
        time.sleep(0.05)
    assert len(ranks) == 2, "the rank processes did not start"
    with sessions() as s:
        s.add(Attempt(run_id=run_id, number=1, status=AttemptStatus.RUNNING.value, dir=f"{run_dir}/attempts/1",
                      pid=parent.pid, pid_create_time=root.create_time(), devices_json=json.dumps(devices),
                      started_at=time.time()))
        s.commit()
    return Tree(run_id, parent, ranks)


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


@pytest.fixture
def trees() -> Iterator[list[Tree]]:
    started: list[Tree] = []
    yield started
    for tree in started:
        for proc in tree.ranks:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        tree.parent.kill()
        tree.parent.wait()


def sample_window(monitor: SystemMonitor, samples: int = 5, real_gap_s: float = 0.3) -> None:
    """``samples`` samples in one window, then one in the next, which writes the first."""
    for _ in range(samples):
        monitor.sample()
        time.sleep(real_gap_s)
    monitor.sample()


def by_series(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["device"], r["run_id"], r["rank"], r["key"]): r for r in rows}


def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
