"""One node of a Slurm attempt: ``srun`` starts this once per node, and it runs that node's
torchrun agent. Run by orchestrator/executors/slurm/job.py, never by hand::

    python -m orchestrator.executors.slurm.node --attempt-dir DIR --head HOST --port PORT --nnodes N \\
        --nproc-per-node P --rdzv-id ID -- ENTRY...

It plays the shim's part on a compute node (orchestrator/executors/shim.py): it starts torchrun as its
child (SIGKILL to torchrun if this process dies, and the ranks die with torchrun), waits, and
writes how this node ended to ``DIR/nodes/<node>.json`` on the shared filesystem.

Signals: Slurm signals every process of the step (proctrack), so a SIGTERM from ``scancel``, a
preemption or the time limit reaches torchrun and every rank directly, as a spot preemption does
on one machine: the ranks checkpoint and exit, torchrun ends. This process only waits (it
ignores SIGTERM, SIGINT, SIGHUP and SIGUSR2). SIGUSR1 asks for stacks: torchrun is started with
SIGUSR1 ignored (inherited by a plain script's ranks, which it would otherwise kill; runyard's
own ranks install their faulthandler over it), and this process saves every rank's stacks of
this node into ``DIR/stacks`` (orchestrator/executors/stacks.py), then ``stacks/node-<node>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import psutil

from db.vocabulary.layout import AttemptPaths
from orchestrator.executors.launcher import LOOPBACK, torchrun_command
from orchestrator.executors.shim import write_atomic
from orchestrator.executors.stacks import dump_stacks
from trainer.agent.warm import room as warm_room
from trainer.process import pdeathsig

NODES_DIR = "nodes"


def node_file(attempt_dir: Path, node: int) -> Path:
    """Where node ``node`` of an attempt records how it ended."""
    return attempt_dir / NODES_DIR / f"{node}.json"


def stacks_file(attempt_dir: Path, node: int) -> Path:
    """Where node ``node`` records the ranks of its latest stack dump."""
    return AttemptPaths(attempt_dir).stacks / f"node-{node}.json"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.executors.slurm.node")
    parser.add_argument("--attempt-dir", required=True, type=Path)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--attempt", required=True, type=int)
    parser.add_argument("--head", required=True)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--nnodes", required=True, type=int)
    parser.add_argument("--nproc-per-node", required=True, type=int)
    parser.add_argument("--rdzv-id", required=True)
    parser.add_argument("--warm-ranks", action="store_true",
                        help="fork the ranks from torchrun's agent with torch imported (trainer/agent/warm.py)")
    parser.add_argument("entry", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.entry[:1] == ["--"]:
        args.entry = args.entry[1:]
    if not args.entry:
        parser.error("the ranks' entry (after --) is missing")
    return args


def command(args: argparse.Namespace, node: int) -> list[str]:
    """This node's torchrun: on loopback when the job has one node (nothing of it reachable from
    elsewhere), else with the rendezvous on the allocation's first host."""
    loopback = args.nnodes == 1
    endpoint = f"{LOOPBACK if loopback else args.head}:{args.port}"
    return torchrun_command(nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, endpoint=endpoint,
                            rdzv_id=args.rdzv_id, node=node, attempt_dir=args.attempt_dir, entry=args.entry,
                            loopback=loopback, warm=args.warm_ranks)


def _child_setup(parent: int) -> Callable[[], None]:
    """torchrun's setup between fork and exec: default dispositions, SIGUSR1 ignored (see the
    module docstring), and SIGKILL when this process dies."""
    prctl = pdeathsig.prctl_function()

    def setup() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        if pdeathsig.set_pdeathsig(signal.SIGKILL, prctl) and os.getppid() != parent:
            os._exit(1)

    return setup


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    node = int(os.environ.get("SLURM_NODEID", "0"))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    dump_wanted = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: dump_wanted.set())
    started = time.time()
    # With warm ranks, the agent's environment carries the room for the ranks' larger one.
    env = {**os.environ, **(warm_room() if args.warm_ranks else {})}
    child = subprocess.Popen(command(args, node), env=env, restore_signals=True,
                             preexec_fn=_child_setup(os.getpid()))  # noqa: PLW1509 - the node program has one thread
    create_time = _create_time(child.pid)
    while child.poll() is None:
        if dump_wanted.wait(0.5):
            dump_wanted.clear()
            threading.Thread(target=_dump, args=(args, node, child.pid, create_time), daemon=True).start()
    record = {"node": node, "host": socket.gethostname(), "pid": child.pid, "exit_code": child.returncode,
              "started_at": started, "ended_at": time.time()}
    path = node_file(args.attempt_dir, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(str(path), json.dumps(record))
    code = child.returncode
    return code if code >= 0 else 128 - code


def _create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _dump(args: argparse.Namespace, node: int, pid: int, create_time: float | None) -> None:
    """Save this node's ranks' stacks, then say which ranks they were (the scheduler waits for
    every node's file)."""
    result = dump_stacks(args.run_dir, args.attempt, pid, create_time, args.attempt_dir)
    summary = {"node": node, "at": time.time(), "ranks": [asdict(r) for r in result.ranks]}
    path = stacks_file(args.attempt_dir, node)
    write_atomic(str(path), json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
