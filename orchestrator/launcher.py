"""Builds torchrun's argv and starts it in its own process session. No shell, ever."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from db.config import RunConfig
from db.layout import EXIT_FILE, LAUNCHER_LOG, RANK_LOG_DIR
from orchestrator.scriptwatch import WANDB_SHIM_VAR, with_wandb_shim

# Every socket of a run on this machine listens here (trainer/torchrun.py).
LOOPBACK = "127.0.0.1"
# The runner of a script under another interpreter (workload.python), started by its path.
SCRIPT_RUNNER = Path(__file__).resolve().parent.parent / "trainer" / "script_runner.py"


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


def torchrun_argv(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path, *,
                  resuming: bool = False) -> list[str]:
    """The torchrun command of one attempt.

    runyard owns retries (with backoff and failure classification), so torchrun's own restarts
    are off. Each rank's stdout/stderr goes to its own file under ``attempt_dir/ranks``, and
    torchrun writes each failed rank's error file there too.

    torchrun runs through trainer/torchrun.py, which binds every socket of the run (torchrun's
    stores, gloo's and NCCL's) to loopback: nothing of a run on this machine is reachable from
    another host. ``--local-addr`` is the address the workers are told to reach the agent's store
    at (MASTER_ADDR); by default torchrun would use the host's name, which may not be loopback.

    Args:
        resuming: The attempt starts from one of the script's own checkpoints: its
            ``resume_args`` follow ``args`` (kind = "script").
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
        *(script_entry(config, resuming) if config.workload.kind == "script" else ["-m", "trainer"]),
    ]


def script_entry(config: RunConfig, resuming: bool = False) -> list[str]:
    """What torchrun starts for a script: a tiny entry module that makes each rank die with
    torchrun's agent (trainer/script_runner.py; the built-in workloads do the same in
    trainer/__main__.py), then runs the script or module as ``python`` would.

    With ``workload.python``, torchrun starts that interpreter itself (``--no-python``) and the
    runner by its path: the ranks then import nothing of runyard's environment.
    """
    workload = config.workload
    target = ["-m", workload.module] if workload.module else [str(workload.script)]
    # The ranks move into workdir themselves: runyard's own processes (the shim, torchrun's
    # agent) run in the run's folder, where no module of the user's shadows runyard's packages.
    workdir = ["--workdir", workload.workdir] if workload.workdir else []
    args = [*workdir, *target, *workload.args, *(workload.resume_args if resuming else ())]
    if workload.python:
        return ["--no-python", workload.python, "-u", str(SCRIPT_RUNNER), *args]
    return ["-m", "trainer.script_runner", *args]


def script_env(config: RunConfig, environ: Mapping[str, str], cores: int | None = None) -> dict[str, str]:
    """The variables a script's ranks get beyond the launcher's own environment.

    ``workload.env``; ``OMP_NUM_THREADS`` as the machine's cores divided by the ranks unless the
    config or the environment sets it (torchrun would set 1, which starves a CPU run); and,
    with ``RUNYARD_WANDB_SHIM=1``, the ``wandb`` stand-in first on ``PYTHONPATH``.
    """
    workload = config.workload
    env = dict(workload.env)
    if "OMP_NUM_THREADS" not in env and "OMP_NUM_THREADS" not in environ:
        cores = cores if cores is not None else len(os.sched_getaffinity(0))
        env["OMP_NUM_THREADS"] = str(max(1, cores // config.launch.nproc_per_node))
    if env.get(WANDB_SHIM_VAR, environ.get(WANDB_SHIM_VAR)) == "1":
        merged = with_wandb_shim({**environ, **env, WANDB_SHIM_VAR: "1"})
        env["PYTHONPATH"] = merged["PYTHONPATH"]
    return env


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
