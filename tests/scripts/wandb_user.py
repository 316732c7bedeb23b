"""A script written for Weights & Biases, which knows nothing of runyard: ``wandb.init`` on rank 0
with a config, ``wandb.log({...}, step=...)`` every step, ``wandb.summary``, ``wandb.finish()``.
Under runyard with ``RUNYARD_WANDB_SHIM=1`` (in ``[workload.env]``), ``import wandb`` finds
runyard's stand-in and the metrics land in runyard's store; nothing is sent anywhere.

    torchrun --nproc-per-node=2 wandb_user.py --steps 30
"""

import argparse
import time

import torch
import torch.distributed as dist
import wandb


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    run = wandb.init(project="tiny-regression", config=vars(args)) if rank == 0 else None
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x = torch.randn(32, 8, generator=g)
        loss = ((ddp(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if run is not None:
            wandb.log({"train/loss": loss.item(), "lr": args.lr}, step=step)
        time.sleep(0.02)
    if run is not None:
        run.summary["final_loss"] = loss.item()
        wandb.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
