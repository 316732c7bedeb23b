"""A plain torchrun script (no runyard import) whose loss depends on a setting it reads from its
environment, as a user's script takes its hyperparameters: ``X`` (default 0), the loss
``(X - 0.3)^2 + 1/step`` averaged over the ranks, printed every step as a ``RUNYARD`` line. A sweep
over ``workload.env.X`` finds 0.3.

    X=0.1 torchrun --nproc-per-node=2 tests/scripts/quadratic.py --steps 5
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    x = float(os.environ.get("X", "0"))
    dist.init_process_group("gloo")
    for step in range(1, args.steps + 1):
        loss = torch.tensor([(x - 0.3) ** 2 + 1.0 / step])
        dist.all_reduce(loss)
        loss /= dist.get_world_size()
        print("RUNYARD " + json.dumps({"step": step, "loss": loss.item(), "total": args.steps}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
