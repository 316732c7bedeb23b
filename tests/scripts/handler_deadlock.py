"""A plain torchrun script whose exception handler waits for the other ranks, as Lightning's
``OnExceptionCheckpoint`` does (Lightning #20187), with torch.distributed alone: rank 1 raises at
step 5 and its handler "saves a checkpoint" through a barrier, while rank 0 waits in the step's
all-reduce. Neither ever returns; runyard's hang watchdog finds rank 1 inside its handler.

    torchrun --nproc-per-node=2 tests/scripts/handler_deadlock.py
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def train_step(step: int, rank: int) -> None:
    if rank == 1 and step == 5:
        raise ValueError(f"bad batch at step {step}")
    dist.all_reduce(torch.tensor([float(step)]))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        for step in range(1, 101):
            train_step(step, rank)
            print(f"step {step}", flush=True)  # output: the watchdog's sign of life for a plain script
            time.sleep(0.05)
    except ValueError as exc:
        dist.barrier()  # the checkpoint's barrier: the other ranks are in the next all-reduce
        raise exc
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
