"""A plain torchrun script that knows nothing of runyard but prints and logs as scripts do: a
``iter N: loss X`` line every step (what a stdout regex reads), TensorBoard scalars from every
rank with two tags on different step counters (``train/loss`` per step, ``eval/acc`` per
"epoch" of 10 steps), and a ``RUNYARD`` protocol line every 5 steps.

    torchrun --nproc-per-node=2 tests/scripts/plain_metrics.py --steps 40 --sleep 0.1
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sleep", type=float, default=0.1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    writer = SummaryWriter("runs/exp", flush_secs=1)  # every rank's file lies here; its name holds the pid
    for step in range(1, args.steps + 1):
        loss = torch.tensor([1.0 / step + rank / 100])
        mean = loss.clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        print(f"iter {step}: loss {loss.item():.4f}", flush=True)
        writer.add_scalar("train/loss", loss.item(), step)
        if step % 10 == 0:
            writer.add_scalar("eval/acc", 0.5 + step / 100 + rank / 1000, step // 10)
        if step % 5 == 0:
            print("RUNYARD " + json.dumps({"step": step, "lr": 0.001 * step, "mean_loss": mean.item(),
                                           "total": args.steps}), flush=True)
        time.sleep(args.sleep)
    writer.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
