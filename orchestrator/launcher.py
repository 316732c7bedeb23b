"""Builds torchrun's argv and starts it in its own process session. No shell, ever."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from db.config import RunConfig
from db.layout import EXIT_FILE, LAUNCHER_LOG, RANK_LOG_DIR

# Every socket of a run on this machine listens here (trainer/torchrun.py).
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Launched:
    pid: int
    create_time: float
    popen: subprocess.Popen


def free_port(host: str = LOOPBACK) -> int:
    """A port that is free now, for the rendezvous of one attempt."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def torchrun_argv(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path) -> list[str]:
    """The torchrun command of one attempt.

    runyard owns retries (with backoff and failure classification), so torchrun's own restarts
    are off. Each rank's stdout/stderr goes to its own file under ``attempt_dir/ranks``, and
    torchrun writes each failed rank's error file there too.

    torchrun runs through trainer/torchrun.py, which binds every socket of the run (torchrun's
    stores, gloo's and NCCL's) to loopback: nothing of a run on this machine is reachable from
    another host. ``--local-addr`` is the address the workers are told to reach the agent's store
    at (MASTER_ADDR); by default torchrun would use the host's name, which may not be loopback.
    """
    return [
        sys.executable, "-m", "trainer.torchrun",
        "--nnodes=1",
        f"--nproc-per-node={config.launch.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={LOOPBACK}:{port}",
        f"--local-addr={LOOPBACK}",
        f"--rdzv-id=runyard-{run_id}-{attempt}",
        "--max-restarts=0",
        f"--log-dir={attempt_dir / RANK_LOG_DIR}",
        "--redirects=3",
        # A script runs under a tiny entry module that makes its ranks die with torchrun's agent
        # (trainer/script_runner.py); the built-in workloads do the same in trainer/__main__.py.
        *(
            ["-m", "trainer.script_runner", config.workload.script, *config.workload.args]
            if config.workload.kind == "script"
            else ["-m", "trainer"]
        ),
    ]


def launch(
    argv: list[str], attempt_dir: Path, cwd: Path, env_extra: dict[str, str]
) -> Launched:
    """Start ``argv`` under the exit-code shim in a new session; returns pid and create time."""
    attempt_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONUNBUFFERED"] = "1"
    shim = [sys.executable, "-m", "orchestrator.shim", "--exit-file", str(attempt_dir / EXIT_FILE), "--", *argv]
    with open(attempt_dir / LAUNCHER_LOG, "ab") as log:
        popen = subprocess.Popen(
            shim,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    create_time = psutil.Process(popen.pid).create_time()
    return Launched(pid=popen.pid, create_time=create_time, popen=popen)
