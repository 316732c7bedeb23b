"""The local executor: torchrun on this machine, under the exit-code shim, in a session of its own.

Custody by pid and process create time (never a recycled pid); the exit code from the shim's
exit file, so that it survives a scheduler restart; processes found by the launcher's tree and
by the run directory in their environment (ranks orphaned by a killed agent). A run of several
nodes is one torchrun agent per node, all on this machine under one shim (orchestrator/executors/shim.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import psutil
from sqlalchemy.orm import Session

from db.models import Attempt, Run
from db.vocabulary.config import RunConfig, config_from_json
from orchestrator.executors.base import LaunchRequest, Liveness, Observation
from orchestrator.executors.launcher import agent_env, launch, torchrun_argv
from orchestrator.executors.processes import end_processes, is_alive, rank_processes, read_exit, signal_attempt
from orchestrator.executors.stacks import StackDump, dump_stacks
from orchestrator.executors.sweeper import Sweeper
from trainer.faults import LaunchFaults

# The stop signals torchrun's agent handles by passing them on to its ranks (it dies of others).
AGENT_PASSES_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def stop_signal(run: Run) -> signal.Signals:
    """The signal a pause or a cancel sends first: a script's ``workload.stop_signal``, else SIGTERM."""
    workload = config_from_json(run.config_json).workload
    return signal.Signals[workload.stop_signal] if workload.kind == "script" else signal.SIGTERM

logger = logging.getLogger(__name__)


class CommandFactory(Protocol):
    """(config, run id, attempt number, rendezvous port, attempt dir, resuming[, node]) -> argv.
    torchrun by default; tests pass a plain process here to exercise supervision without paying
    for torch (``node`` is passed only for a run of several nodes)."""

    def __call__(self, config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path, *,
                 resuming: bool = False) -> list[str]: ...


class LocalExecutor:
    """Attempts as process trees on this machine."""

    name = "local"

    def __init__(self, command: CommandFactory = torchrun_argv):
        self.command = command
        self.sweeper = Sweeper()
        self._faults = LaunchFaults.installed()  # None outside runyard's tests
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def submit(self, request: LaunchRequest, attempt: Attempt) -> str:
        config = request.config
        nnodes = config.launch.nnodes
        build = functools.partial(self.command, config, request.run_id, request.number, request.port,
                                  request.attempt_dir, resuming=request.resuming)
        argv: list[str] | list[list[str]] = (
            build() if nnodes == 1 else [build(node=node) for node in range(nnodes)])  # type: ignore[call-arg]
        launched = launch(argv, request.attempt_dir, request.cwd, agent_env(config, request.env),
                          grace_s=config.supervision.grace_s)
        if self._faults and self._faults.exit_after_launch():
            # Tests only: die where a crash leaves the attempt row with pid IS NULL.
            logger.warning("RUNYARD_FAULT_EXIT_AFTER_LAUNCH: exiting before committing pid %d", launched.pid)
            os._exit(70)
        self._children[launched.pid] = launched.popen
        attempt.pid = launched.pid
        attempt.pid_create_time = launched.create_time
        ranks = (f"{nnodes} node(s) x {config.launch.nproc_per_node} rank(s) on this machine" if nnodes > 1
                 else f"{config.launch.nproc_per_node} rank(s)")
        return f"{ranks}, port {request.port}" + (f", GPUs {request.devices}" if request.devices else "")

    def poll(self, attempts: Sequence[Attempt]) -> None:
        """Collect the exit status of launchers this process started (no zombies). ``attempts``
        is not needed (the scheduler passes none): a process is looked at directly by
        :meth:`observe`, which costs less than keeping a table."""
        for pid, popen in list(self._children.items()):
            if popen.poll() is not None:
                del self._children[pid]

    def observe(self, session: Session, run: Run, attempt: Attempt) -> Observation:
        attempt_dir = Path(attempt.dir)
        exited = read_exit(attempt_dir)
        if exited is not None:
            return Observation(Liveness.ENDED, exited)
        if is_alive(attempt.pid, attempt.pid_create_time):
            return Observation(Liveness.ALIVE)
        exited = read_exit(attempt_dir)  # it may have exited between the two looks
        if exited is not None:
            return Observation(Liveness.ENDED, exited)
        return Observation(Liveness.VANISHED)

    def has_handle(self, attempt: Attempt) -> bool:
        return attempt.pid is not None

    def adopt(self, session: Session, run: Run, attempt: Attempt) -> None:
        self.sweeper.adopt_from_record(session, run, attempt)

    def ranks_running(self, run: Run, attempt: Attempt) -> bool:
        return bool(rank_processes(run.run_dir, attempt.number, attempt.pid, attempt.pid_create_time, orphans=False))

    def queued(self, attempt: Attempt) -> bool:
        return False  # started at once

    def terminate(self, run: Run, attempt: Attempt) -> bool:
        sig = stop_signal(run)
        if sig in AGENT_PASSES_ON:
            return bool(signal_attempt(run.run_dir, attempt.number, attempt.pid, attempt.pid_create_time, sig))
        # torchrun's agent would die of it (and take its ranks down unsaved): the ranks alone.
        sent = 0
        for proc in rank_processes(run.run_dir, attempt.number, attempt.pid, attempt.pid_create_time):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
                sent += 1
        return bool(sent)

    def kill(self, run: Run, attempt: Attempt) -> None:
        signal_attempt(run.run_dir, attempt.number, attempt.pid, attempt.pid_create_time, signal.SIGKILL)

    def end_older(self, run: Run, attempt: Attempt) -> None:
        end_processes(run.run_dir, spare_attempt=attempt.number, wait_s=0.0)

    def sweep(self, session: Session, run: Run, number: int, attempt: Attempt | None) -> bool:
        pid = attempt.pid if attempt is not None else None
        create = attempt.pid_create_time if attempt is not None else None
        return self.sweeper.swept(session, run, number, pid, create)

    def stack_dump(self, run: Run, attempt: Attempt) -> Callable[[], StackDump]:
        return functools.partial(dump_stacks, run.run_dir, attempt.number, attempt.pid, attempt.pid_create_time,
                                 Path(attempt.dir))
