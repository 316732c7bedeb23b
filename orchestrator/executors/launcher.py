"""Builds torchrun's argv and starts it in its own process session. No shell, ever."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from db.vocabulary.config import RunConfig, ScriptWorkload
from db.vocabulary.layout import EXIT_FILE, LAUNCHER_LOG, RANK_LOG_DIR
from orchestrator.executors.ports import rendezvous_port
from trainer.agent.warm import WARM_OPTION
from trainer.agent.warm import room as warm_room

# Every socket of a run on this machine listens here (trainer/agent/torchrun.py).
LOOPBACK = "127.0.0.1"
# The runner of a script under another interpreter (workload.python), started by its path.
SCRIPT_RUNNER = Path(__file__).resolve().parents[2] / "trainer" / "process" / "script_runner.py"
# The folder that holds the ``wandb`` stand-in of plain-script support (shims/wandb/): put first on
# the ranks' path. A folder on PYTHONPATH, never imported here: executors import nothing of scripts.
SHIMS_DIR = Path(__file__).resolve().parents[1] / "scripts" / "shims"
WANDB_SHIM_VAR = "RUNYARD_WANDB_SHIM"


@dataclass(frozen=True)
class Launched:
    pid: int
    create_time: float
    popen: subprocess.Popen[bytes]


def free_port(host: str = LOOPBACK) -> int:
    """A port that is free now, for the rendezvous of one attempt (orchestrator/executors/ports.py)."""
    return rendezvous_port(host)


def torchrun_argv(config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path, *,
                  resuming: bool = False, node: int = 0) -> list[str]:
    """The torchrun command of one attempt (of one of its nodes, when it has several).

    runyard owns retries (with backoff and failure classification), so torchrun's own restarts
    are off. Each rank's stdout/stderr goes to its own file under ``attempt_dir/ranks``, and
    torchrun writes each failed rank's error file there too.

    torchrun runs through trainer/agent/torchrun.py, which binds every socket of the run (torchrun's
    stores, gloo's and NCCL's) to loopback: nothing of a run on this machine is reachable from
    another host. ``--local-addr`` is the address the workers are told to reach the agent's store
    at (MASTER_ADDR); by default torchrun would use the host's name, which may not be loopback.

    A local run of several nodes (``launch.nnodes``) is one agent per node on this machine, all
    on loopback: node 0 hosts the rendezvous store (``is_host=1``), the others join it, and each
    node logs under ``ranks/node-<n>/``.

    Args:
        resuming: The attempt starts from one of the script's own checkpoints: its
            ``resume_args`` follow ``args`` (kind = "script").
        node: Which node's agent (0 to nnodes - 1).
    """
    return torchrun_command(nnodes=config.launch.nnodes, nproc_per_node=config.launch.nproc_per_node,
                            endpoint=f"{LOOPBACK}:{port}", rdzv_id=rdzv_id(run_id, attempt), node=node,
                            attempt_dir=attempt_dir, entry=entry_argv(config, resuming), warm=warm_start(config))


def warm_start(config: RunConfig) -> bool:
    """Whether the ranks are forked from torchrun's agent with torch imported (trainer/agent/warm.py):
    the built-in workloads, unless ``launch.warm_start = false``."""
    return config.launch.warm_start and config.workload.kind != "script"


def rdzv_id(run_id: int, attempt: int) -> str:
    """The rendezvous id of one attempt (every node of it joins this one)."""
    return f"runyard-{run_id}-{attempt}"


def entry_argv(config: RunConfig, resuming: bool = False) -> list[str]:
    """What torchrun starts in each rank: the built-in trainer, or the script's runner."""
    return script_entry(config, resuming) if config.workload.kind == "script" else ["-m", "trainer"]


def torchrun_command(*, nnodes: int, nproc_per_node: int, endpoint: str, rdzv_id: str, node: int,
                     attempt_dir: Path, entry: list[str], loopback: bool = True, warm: bool = False) -> list[str]:
    """torchrun's argv for one node's agent, through trainer/agent/torchrun.py.

    Args:
        endpoint: ``host:port`` of the c10d rendezvous (node 0 hosts it).
        loopback: Every node is on this machine (a local run, a one-node Slurm job): every socket
            on loopback. False: a job across hosts, whose sockets must be reachable
            (``--network=cluster``); the agents then tell the workers their host's name.
        warm: Fork the ranks from the agent with torch imported (``--warm-ranks``); the agent's
            environment must then carry :func:`trainer.agent.warm.room` (:func:`agent_env` adds it).
    """
    log_dir = attempt_dir / RANK_LOG_DIR if nnodes == 1 else attempt_dir / RANK_LOG_DIR / f"node-{node}"
    return [
        sys.executable, "-m", "trainer.agent.torchrun",
        *([] if loopback else ["--network=cluster"]),
        *([WARM_OPTION] if warm else []),
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        *([f"--local-addr={LOOPBACK}"] if loopback else []),
        f"--rdzv-id={rdzv_id}",
        *([f"--rdzv-conf=is_host={1 if node == 0 else 0}"] if nnodes > 1 else []),
        "--max-restarts=0",
        f"--log-dir={log_dir}",
        "--redirects=3",
        *entry,
    ]


def script_entry(config: RunConfig, resuming: bool = False) -> list[str]:
    """What torchrun starts for a script: a tiny entry module that makes each rank die with
    torchrun's agent (trainer/process/script_runner.py; the built-in workloads do the same in
    trainer/__main__.py), then runs the script or module as ``python`` would.

    With ``workload.python``, torchrun starts that interpreter itself (``--no-python``) and the
    runner by its path: the ranks then import nothing of runyard's environment.
    """
    workload = config.workload
    if not isinstance(workload, ScriptWorkload):
        raise ValueError(f"workload.kind = {workload.kind!r}: only a script (kind = 'script') has a script entry")
    target = ["-m", workload.module] if workload.module else [str(workload.script)]
    # The ranks move into workdir themselves: runyard's own processes (the shim, torchrun's
    # agent) run in the run's folder, where no module of the user's shadows runyard's packages.
    workdir = ["--workdir", workload.workdir] if workload.workdir else []
    args = [*workdir, *target, *workload.args, *(workload.resume_args if resuming else ())]
    if workload.python:
        return ["--no-python", workload.python, "-u", str(SCRIPT_RUNNER), *args]
    return ["-m", "trainer.process.script_runner", *args]


def with_wandb_shim(env: Mapping[str, str]) -> dict[str, str]:
    """The ranks' environment: when ``RUNYARD_WANDB_SHIM=1`` in it, ``SHIMS_DIR`` first on
    ``PYTHONPATH`` so that ``import wandb`` finds the stand-in; otherwise unchanged."""
    out = dict(env)
    if out.get(WANDB_SHIM_VAR) == "1":
        rest = out.get("PYTHONPATH")
        out["PYTHONPATH"] = os.pathsep.join([str(SHIMS_DIR), *([rest] if rest else [])])
    return out


def rank_env(config: RunConfig, environ: Mapping[str, str], cores: int | None = None) -> dict[str, str]:
    """The variables a run's ranks get beyond the launcher's own environment.

    ``OMP_NUM_THREADS``: the machine's cores divided by its ranks, unless the config (a script's
    ``workload.env``) or the environment sets it. torchrun would set 1 where a node has several
    ranks (which starves a CPU script) and nothing where it has one, so a 2-node local run of one
    rank each got all the cores per rank (oversubscribed) and other arithmetic than the same
    world on one node: its losses differed from the 1-node run's in the last bits under load.
    For a script also ``workload.env`` and, with ``RUNYARD_WANDB_SHIM=1``, the ``wandb``
    stand-in first on ``PYTHONPATH``.
    """
    workload = config.workload
    env = dict(workload.env) if isinstance(workload, ScriptWorkload) else {}  # a script's own table
    if "OMP_NUM_THREADS" not in env and "OMP_NUM_THREADS" not in environ:
        cores = cores if cores is not None else len(os.sched_getaffinity(0))
        # Locally every node's ranks share this machine; on Slurm each node has its own cores.
        here = config.launch.world_size if config.launch.executor == "local" else config.launch.nproc_per_node
        env["OMP_NUM_THREADS"] = str(max(1, cores // here))
    if isinstance(workload, ScriptWorkload) and env.get(WANDB_SHIM_VAR, environ.get(WANDB_SHIM_VAR)) == "1":
        merged = with_wandb_shim({**environ, **env, WANDB_SHIM_VAR: "1"})
        env["PYTHONPATH"] = merged["PYTHONPATH"]
    return env


def agent_env(config: RunConfig, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of the attempt's processes (``env``), with room for the ranks' larger
    environment in the agent's memory where the ranks start warm (trainer/agent/warm.py)."""
    return {**env, **(warm_room() if warm_start(config) else {})}


def launch(
    argv: list[str] | list[list[str]], attempt_dir: Path, cwd: Path, env_extra: dict[str, str], grace_s: float = 30.0
) -> Launched:
    """Start ``argv`` under the exit-code shim in a new session; returns pid and create time.

    ``argv`` is one command, or one per node (a local run of several nodes): the shim then starts
    them all and ends the group when one fails, SIGKILL ``grace_s`` after SIGTERM
    (orchestrator/executors/shim.py).
    """
    attempt_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONUNBUFFERED"] = "1"
    shim = [sys.executable, "-m", "orchestrator.executors.shim", "--exit-file", str(attempt_dir / EXIT_FILE)]
    if argv and isinstance(argv[0], list):
        shim += ["--nodes-json", json.dumps(argv), "--grace-s", str(grace_s)]
    else:
        shim += ["--", *(str(a) for a in argv)]
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
