"""The batch program of one Slurm attempt: Slurm runs it on the allocation's first node.

The scheduler writes a tiny ``job.py`` into the attempt's folder that calls :func:`main` with
its arguments (JSON, no shell anywhere) and submits it with ``sbatch``
(orchestrator/executors/slurm/executor.py). It:

1. finds the allocation's first host (``scontrol show hostnames``: never the login node's
   address) and a free port there for torchrun's c10d rendezvous;
2. runs ``srun`` with one task per node (orchestrator/executors/slurm/node.py), each running torchrun;
3. on Slurm's warning signal (``--signal=B:USR2@<lead>``, sent only to this program), sends
   SIGTERM to every process of the job's steps (``scancel --signal=TERM``): the ranks checkpoint
   and exit, as on a spot preemption on one machine;
4. writes the exit marker ``exit.json`` (the first failing node's exit code, whether the warning
   came) when srun ends: with accounting off, this file is how the scheduler learns how the job
   ended.

A SIGTERM to this program says only that Slurm is ending the job: a plain ``scancel``, the time
limit and a preemption all send it (then SIGKILL). Which one it was, slurmstepd writes into the
job's output (our launcher log) just before: ``*** JOB 12 ON node1 CANCELLED AT <time> ***`` for
a ``scancel``, the same line ending ``DUE TO TIME LIMIT`` (``PREEMPTION``, ``JOB REQUEUE``, ...)
for Slurm's own stops (docs/SLURM_NOTES.md, "Signals"). The marker keeps that line's words
(``slurm_stop``), so the scheduler ends a run a person cancelled instead of resubmitting it.
runyard's own stops (``scancel --signal=TERM``, to the steps only) never reach this program.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from db.vocabulary.layout import EXIT_FILE, LAUNCHER_LOG
from orchestrator.executors.ports import rendezvous_port
from orchestrator.executors.shim import write_atomic
from orchestrator.executors.slurm.node import NODES_DIR

POLL_S = 0.5
# slurmstepd's line in the batch output when it stops the batch program (see the module's docstring).
_STOP_LINE = re.compile(r"\*\*\* JOB (?P<job>\d+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
                        r"(?: DUE TO (?P<due_to>[^*]+?))? \*\*\*")
# How much of the end of the batch output is searched for it.
STOP_LINE_WINDOW = 256 * 1024


def stop_line(output: Path, job_id: str | None) -> dict[str, str | None] | None:
    """slurmstepd's last word on stopping job ``job_id``, from the end of its output file:
    ``{"at", "node", "due_to"}`` (``due_to`` None: a plain ``scancel``; else ``TIME LIMIT``,
    ``PREEMPTION``, ...), or None when it wrote none."""
    try:
        with open(output, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - STOP_LINE_WINDOW))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = [m for m in _STOP_LINE.finditer(text) if job_id is None or m["job"] == job_id]
    if not found:
        return None
    last = found[-1]
    return {"at": last["at"], "node": last["node"], "due_to": last["due_to"].strip() if last["due_to"] else None}


def first_host() -> str:
    """The allocation's first host, where node 0 hosts the rendezvous."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if nodelist:
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                 timeout=30, check=True).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return socket.gethostname()


def free_port(loopback: bool) -> int:
    """A free port on this host (bound on loopback for a one-node job, else on every address,
    as the other nodes must reach it)."""
    return rendezvous_port("127.0.0.1" if loopback else "")


def node_records(attempt_dir: Path) -> list[dict[str, Any]]:
    """What each node wrote when its torchrun ended, by node."""
    records = []
    for path in sorted((attempt_dir / NODES_DIR).glob("*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(records, key=lambda r: int(r.get("node", 0)))


def exit_record(srun_code: int, nodes: list[dict[str, Any]], nnodes: int, started: float, warned: bool,
                terminated: bool) -> dict[str, Any]:
    """The exit marker: the first node to fail (by its end time) gives the exit code and pid, as
    the shim's record does for a local run; 0 when every node ended well; srun's own code when a
    node left no record (it never started, or died before it could write)."""
    failed = sorted((n for n in nodes if n.get("exit_code")), key=lambda n: float(n.get("ended_at", 0)))
    first = failed[0] if failed else None
    if first is not None:  # noqa: SIM108 - three cases read better as a block
        code = int(first["exit_code"])
    else:
        code = 0 if len(nodes) >= nnodes else (srun_code or 1)
    return {"exit_code": code, "pid": first.get("pid") if first else None, "node": first.get("node") if first else None,
            "started_at": started, "ended_at": time.time(), "job_id": os.environ.get("SLURM_JOB_ID"),
            "warned": warned, "terminated": terminated, "srun_exit_code": srun_code, "nodes": nodes}


def main(args: dict[str, Any]) -> int:
    """Run the attempt. ``args``: attempt_dir, run_dir, attempt, nnodes, nproc_per_node,
    rdzv_id, entry (the ranks' argv after torchrun's options), warm (the ranks forked from each
    node's agent: trainer/agent/warm.py)."""
    attempt_dir = Path(args["attempt_dir"])
    nnodes = int(args["nnodes"])
    started = time.time()
    events = {"warned": False, "terminated": False}

    def on_warning(_sig: int, _frame: object) -> None:
        events["warned"] = True

    def on_term(_sig: int, _frame: object) -> None:
        events["terminated"] = True  # srun and the ranks got it too: wait for them, then write the marker

    signal.signal(signal.SIGUSR2, on_warning)
    signal.signal(signal.SIGTERM, on_term)
    head = first_host()
    port = free_port(loopback=nnodes == 1)
    where = f"{head}:{port}" if nnodes > 1 else f"loopback port {port} (one node: reachable from nowhere else)"
    print(f"[runyard] job {os.environ.get('SLURM_JOB_ID')}: {nnodes} node(s) ({os.environ.get('SLURM_JOB_NODELIST')}),"
          f" rendezvous on {where}", flush=True)
    srun = ["srun", f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            sys.executable, "-m", "orchestrator.executors.slurm.node", f"--attempt-dir={attempt_dir}",
            f"--run-dir={args['run_dir']}", f"--attempt={args['attempt']}", f"--head={head}", f"--port={port}",
            f"--nnodes={nnodes}", f"--nproc-per-node={args['nproc_per_node']}", f"--rdzv-id={args['rdzv_id']}",
            *(["--warm-ranks"] if args.get("warm") else []), "--", *args["entry"]]
    child = subprocess.Popen(srun)
    forwarded = False
    while child.poll() is None:
        if events["warned"] and not forwarded:
            forwarded = True
            print("[runyard] Slurm's warning signal: the ranks checkpoint and stop (SIGTERM to the job's steps)",
                  flush=True)
            job = os.environ.get("SLURM_JOB_ID", "")
            subprocess.run(["scancel", "--signal=TERM", job], check=False, timeout=60)
        time.sleep(POLL_S)
    record = exit_record(child.returncode, node_records(attempt_dir), nnodes, started, events["warned"],
                         events["terminated"])
    if events["terminated"]:
        record["slurm_stop"] = stop_line(attempt_dir / LAUNCHER_LOG, os.environ.get("SLURM_JOB_ID"))
    write_atomic(str(attempt_dir / EXIT_FILE), json.dumps(record))
    print(f"[runyard] srun ended with {child.returncode}; attempt exit code {record['exit_code']}", flush=True)
    return 0 if record["exit_code"] == 0 else 1


def program(args: dict[str, Any], python: str) -> str:
    """The text of ``job.py``: the interpreter that runs runyard, and the arguments as JSON."""
    return (f"#!{python}\n"
            f"# runyard: run {args['run_id']}, attempt {args['attempt']}. Written by the scheduler; Slurm runs it\n"
            "# on the first node of the allocation (orchestrator/executors/slurm/job.py).\n"
            "import json, sys\n"
            "from orchestrator.executors.slurm.job import main\n"
            f"sys.exit(main(json.loads({json.dumps(json.dumps(args))})))\n")
