"""Graceful stop and evidence: SIGTERM makes the ranks finish the step, checkpoint and exit;
SIGUSR1 makes each rank write every thread's Python stack into the attempt's folder.

The scheduler sends SIGTERM for cancel and pause; anything else that sends it (a spot
preemption, a cluster manager) is told apart by the scheduler, which knows what it sent.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist

STOPPED_FILE = "stopped.json"
STACKS_DIR = "stacks"


class StopSignal:
    """Set by SIGTERM; :meth:`agreed` makes every rank stop at the same step.

    At log steps the flag travels in the metrics exchange (trainer/monitoring.py), which hands
    the agreed answer over with :meth:`fold`; the next :meth:`agreed` returns it without a
    collective of its own. So a step has one small collective of runyard's, on CPU tensors:
    the exchange at log steps, this flag's all-reduce at the others.
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.received_at: float | None = None
        self._flag = torch.zeros(1)
        self._group: dist.ProcessGroup | None = None  # of the all-reduce (None: the default group)
        self._group_known = False  # chosen (and, under NCCL, made) at the first all-reduce
        self._folded: bool | None = None
        # Wraps the flag's all-reduce: the straggler clock does not count a wait in it as work.
        self.around_collective: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.received_at is None:
            self.received_at = time.time()

    def fold(self, any_received: bool) -> None:
        """Every rank's flag was just exchanged: ``any_received`` is the agreed answer for the
        next :meth:`agreed` (every rank folds at the same steps)."""
        self._folded = any_received

    def agreed(self) -> bool:
        """Collective, once per step: true on every rank as soon as any rank got SIGTERM
        (torchrun forwards it to all ranks, but not at the same instant). Free right after a
        :meth:`fold`."""
        if self._folded is not None:
            answer, self._folded = self._folded, None
            return answer
        if self.world_size == 1 or not dist.is_initialized():
            return self.received_at is not None
        if not self._group_known:
            from trainer.monitoring import control_group

            self._group, self._group_known = control_group(), True
        self._flag.fill_(1.0 if self.received_at is not None else 0.0)
        with self.around_collective():
            dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(self._flag.item())


def write_stopped(attempt_dir: Path, step: int, checkpoint_step: int | None, received_at: float | None) -> None:
    """Rank 0 leaves a note that the attempt stopped on request, with its last checkpoint."""
    attempt_dir.mkdir(parents=True, exist_ok=True)
    tmp = attempt_dir / f".{STOPPED_FILE}.tmp"
    tmp.write_text(json.dumps({"step": step, "checkpoint_step": checkpoint_step, "signal": "SIGTERM",
                               "received_at": received_at, "stopped_at": time.time()}))
    os.replace(tmp, attempt_dir / STOPPED_FILE)


def register_stack_dumps(attempt_dir: Path, rank: int) -> IO[str]:
    """SIGUSR1 -> this rank's stacks appended to ``attempt_dir/stacks/rank-<r>.txt``."""
    folder = attempt_dir / STACKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    out = open(folder / f"rank-{rank}.txt", "a")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=False)
    return out
