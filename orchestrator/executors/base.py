"""Where an attempt runs: the executor interface the scheduler's reconcile loop talks to.

The scheduler decides *what* should happen to a run (launch its next attempt, stop it, settle
it, retry it by cause); an executor does it *somewhere*: :class:`~orchestrator.executors.local.
LocalExecutor` starts torchrun on this machine under the exit-code shim, :class:`~orchestrator.
executors.slurm.SlurmExecutor` submits one Slurm batch job per attempt. The loop never asks
which one it holds. Each executor:

- ``submit``: start an attempt (the attempt row is committed first, so a scheduler that dies
  during the submit finds the row and adopts what was started instead of starting it twice);
- ``poll``: look at many attempts in one call, once a tick (one ``squeue`` for every Slurm job);
- ``observe``: what ``poll`` saw of one attempt: alive, ended with an exit record, vanished,
  or (Slurm) not yet settled;
- ``terminate`` / ``kill``: the graceful stop (SIGTERM to the ranks: they checkpoint and exit)
  and the hard one; the scheduler owns the grace period between them;
- ``sweep``: make sure nothing of a run lives before its attempt is settled and before its next
  one starts (no two attempts of a run ever live together);
- ``adopt``: take back an attempt whose handle (pid, job id) was never committed;
- ``stack_dump``: the job that saves every rank's stacks (run off the tick).

Logs of every executor land in the attempt's folder under the same layout (db/vocabulary/layout.py), so
failure classification, the Run page and ``runyard logs`` read them the same way.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.orm import Session

from db.models import Attempt, Run
from db.vocabulary.config import RunConfig
from orchestrator import OrchestratorError
from orchestrator.executors.stacks import StackDump


class ExecutorError(OrchestratorError):
    """An attempt could not be started or reached; the message says what to do."""


class Liveness(enum.Enum):
    """What an executor can say of an attempt's processes."""

    ALIVE = "alive"  # running, or (Slurm) waiting in the queue
    ENDED = "ended"  # ended; ``Observation.exited`` says how
    VANISHED = "vanished"  # gone without an exit record (killed with its launcher, host rebooted)
    UNSETTLED = "unsettled"  # gone from Slurm's queue, and neither an exit marker nor accounting yet


@dataclass(frozen=True)
class Observation:
    """One look at one attempt."""

    liveness: Liveness
    exited: dict[str, Any] | None = None  # the exit record (exit code, end time...) when ENDED


@dataclass(frozen=True)
class LaunchRequest:
    """Everything an executor needs to start one attempt."""

    run_id: int
    number: int
    config: RunConfig  # the attempt's config (the run's, plus this attempt's overrides)
    attempt_dir: Path
    cwd: Path  # where runyard's launcher and torchrun start (the run's folder)
    env: dict[str, str]  # the ranks' variables beyond the scheduler's own environment
    port: int  # the rendezvous port (local runs; a Slurm job picks its own on its first node)
    resuming: bool  # a script's own checkpoint is handed over: its resume_args follow its args
    devices: list[int] = field(default_factory=list)
    checkpoint_s: float | None = None  # the run's longest checkpoint so far (Slurm's warning lead)


class Executor(Protocol):
    """See the module docstring; one instance per scheduler, shared by every run it supervises."""

    name: str

    def submit(self, request: LaunchRequest, attempt: Attempt) -> str:
        """Start the attempt and fill its handle on the row (pid, or job id); returns a sentence
        for the launch event. Raises OSError or ExecutorError when nothing was started."""
        ...

    def poll(self, attempts: Sequence[Attempt]) -> None:
        """Look at these attempts (all of this executor's live ones) in one go."""
        ...

    def observe(self, session: Session, run: Run, attempt: Attempt) -> Observation:
        """What the last :meth:`poll` (or a direct look) says of one attempt."""
        ...

    def has_handle(self, attempt: Attempt) -> bool:
        """Whether the attempt row knows what it started (a pid, a job id)."""
        ...

    def adopt(self, session: Session, run: Run, attempt: Attempt) -> None:
        """Fill the handle of an attempt row that has none, from what the launch left behind."""
        ...

    def ranks_running(self, run: Run, attempt: Attempt) -> bool:
        """Whether the attempt's ranks have started (a script that reports no step)."""
        ...

    def queued(self, attempt: Attempt) -> bool:
        """Whether the attempt still waits for its allocation (a pending Slurm job): no process
        yet, so no hang to watch for and no start-up clock running."""
        ...

    def terminate(self, run: Run, attempt: Attempt) -> bool:
        """SIGTERM (a script's ``workload.stop_signal``) to every rank (they checkpoint and exit);
        False when nothing could be reached yet (launched a moment ago): the caller tries again on
        the next tick."""
        ...

    def kill(self, run: Run, attempt: Attempt) -> None:
        """End the attempt now (SIGKILL, ``scancel``)."""
        ...

    def end_older(self, run: Run, attempt: Attempt) -> None:
        """End what is left of the run's attempts before ``attempt`` (none should live)."""
        ...

    def sweep(self, session: Session, run: Run, number: int, attempt: Attempt | None) -> bool:
        """End everything of the run and confirm it is gone; False while something survives
        (the run waits, and an event says what)."""
        ...

    def stack_dump(self, run: Run, attempt: Attempt) -> Callable[[], StackDump]:
        """A blocking job that saves every rank's stacks into the attempt's ``stacks/``."""
        ...


def executor_for(executors: dict[str, Executor], name: str) -> Executor:
    """The executor called ``name``.

    Raises:
        ExecutorError: this scheduler has none by that name (not configured on this machine).
    """
    try:
        return executors[name]
    except KeyError:
        raise ExecutorError(f"launch.executor = {name!r}: this scheduler has no such executor "
                            f"(it has {', '.join(sorted(executors))})") from None


