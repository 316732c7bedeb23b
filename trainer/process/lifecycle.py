"""Graceful stop and evidence: SIGTERM makes the ranks finish a step more, checkpoint and exit;
SIGUSR1 makes each rank write every thread's Python stack into the attempt's folder.

The scheduler sends SIGTERM for cancel and pause; anything else that sends it (a spot
preemption, a cluster manager) is told apart by the scheduler, which knows what it sent.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn

from db.vocabulary.layout import FINISHED_DIR, STACKS_DIR, STOPPED_FILE
from trainer.process.process_exit import exit_code_of, exit_now

if TYPE_CHECKING:
    from trainer.reporting.control import ControlChannel

STOP_FLAG = "stop"


class StopSignal:
    """Set by SIGTERM; the ranks agree on it in their control collective.

    It adds its flag to the channel it is handed (:class:`~trainer.reporting.control.ControlChannel`):
    the channel's answer at step ``s`` is what every rank had at the end of step ``s - 1``, so a
    rank that gets SIGTERM during a step stops after the next one, together with the others.

    Args:
        channel: The process's control channel (every rank makes the same one, in the same order).
    """

    def __init__(self, channel: ControlChannel) -> None:
        self.received_at: float | None = None
        channel.add_flag(STOP_FLAG, lambda: self.received_at is not None)

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.received_at is None:
            self.received_at = time.time()


def write_stopped(attempt_dir: Path, step: int, checkpoint_step: int | None, received_at: float | None) -> None:
    """Rank 0 leaves a note that the attempt stopped on request, with its last checkpoint."""
    attempt_dir.mkdir(parents=True, exist_ok=True)
    tmp = attempt_dir / f".{STOPPED_FILE}.tmp"
    tmp.write_text(json.dumps({"step": step, "checkpoint_step": checkpoint_step, "signal": "SIGTERM",
                               "received_at": received_at, "stopped_at": time.time()}))
    os.replace(tmp, attempt_dir / STOPPED_FILE)


def write_finished(attempt_dir: Path, rank: int, step: int | None) -> None:
    """This rank's work is done and durable: its metrics flushed, the last checkpoint written.

    A rank that then dies in the interpreter's shutdown (a C++ destructor racing it aborts the
    process now and then) has still finished; the scheduler tells the two apart by this note,
    ``finished/rank-<r>.json`` in the attempt's folder.
    """
    folder = attempt_dir / FINISHED_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps({"rank": rank, "step": step, "at": time.time()}))
    os.replace(tmp, folder / f"rank-{rank}.json")


def register_stack_dumps(attempt_dir: Path, rank: int) -> IO[str]:
    """SIGUSR1 -> this rank's stacks appended to ``attempt_dir/stacks/rank-<r>.txt``."""
    folder = attempt_dir / STACKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    out = open(folder / f"rank-{rank}.txt", "a")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=False)
    return out


def self_stat(*numbers: int) -> tuple[int, ...]:
    """Fields of ``/proc/self/stat`` by their number in proc(5) (counted from 1; numeric fields
    from 4 on), read in one go. Raises OSError, ValueError or IndexError where ``/proc`` does not
    say (not Linux, an old kernel)."""
    with open("/proc/self/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()  # from field 3 on: the name may hold spaces
    return tuple(int(fields[n - 3]) for n in numbers)


def settle_imports() -> None:
    """End an entry's imports made with the cyclic garbage collector off (``gc.disable()`` at the
    top of ``python -m trainer`` and of torchrun's agent, trainer/agent/torchrun.py): what they
    imported moves to the permanent generation, and the collector is turned back on.

    ``import torch, torch._dynamo`` makes about 290,000 objects that live as long as the process
    (modules, functions, classes), and CPython runs a full collection each time its long-lived
    objects grow by a quarter: five passes of up to 0.1 s during the import, which find almost
    nothing (3.55 s of CPU against 3.14 s without them, median of five, on this machine's two
    cores). Frozen, they are not scanned again by the full collections of the training loop
    either (as ``gc.freeze`` is meant to be used after start-up: its documentation).
    """
    gc.freeze()
    gc.enable()


def exit_without_finalising(main: Callable[[], int | None]) -> NoReturn:
    """Run ``main`` and end the process with its code, without the interpreter's finalisation.

    Once torch is imported that finalisation took 0.1-0.3 s on a quiet machine and 3 s under
    load, and a failed attempt's torchrun waits for every rank's exit, then for its own, before
    the scheduler can start the next attempt. What must outlive the process is written before
    this point (checkpoints, the metrics, the error file of ``@record``), and standard output,
    standard error and logging are flushed here. An exception is printed as the interpreter
    would print it, and exits 1; ``SystemExit`` keeps its code (trainer/process/process_exit.py, which a
    user's script ends through too, after what the interpreter's shutdown would do for it).
    Clean ends too: C++ destructors of the process group's threads racing with finalisation
    occasionally aborted an otherwise finished rank ("terminate called without an active
    exception").
    """
    exit_now(exit_code_of(main))
