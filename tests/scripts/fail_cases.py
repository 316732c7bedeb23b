"""A plain torchrun script (no runyard import) that fails in one of several ways, for the
failure classifier's fixtures (tests/fixtures/torchrun/) and its integration test.

    torchrun --nproc-per-node=2 tests/scripts/fail_cases.py CASE

Cases: ``raise_rank1`` (rank 1 raises at step 50), ``segfault`` (rank 1 dies of SIGSEGV at step
5), ``exit3`` (rank 1 calls ``sys.exit(3)`` at step 5), ``collective_raise`` (rank 0 raises inside
a collective call at step 5), ``record`` (like ``raise_rank1`` under torchrun's ``@record``,
which writes an error file).
"""

from __future__ import annotations

import ctypes
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def scale_gradients(step: int, rank: int) -> None:
    if rank == 1 and step == 50:
        raise ValueError(f"loss went NaN at step {step}")


def train_step(step: int, rank: int, case: str) -> float:
    value = torch.tensor([float(step + rank)])
    if case in ("raise_rank1", "record"):
        scale_gradients(step, rank)
    elif case == "segfault" and rank == 1 and step == 5:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    elif case == "exit3" and rank == 1 and step == 5:
        sys.exit(3)
    elif case == "collective_raise" and step == 5:
        # Rank 0 names a source rank that does not exist; rank 1 waits in the broadcast for it.
        dist.broadcast(torch.ones(2), src=2 if rank == 0 else 0)
    dist.all_reduce(value)
    return value.item()


def main() -> None:
    case = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(1, 101):
        total = train_step(step, rank, case)
        if rank == 0 and step % 10 == 0:
            print(f"iter {step}: loss {1.0 / total:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    (record(main) if sys.argv[1:2] == ["record"] else main)()
