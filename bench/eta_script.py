"""A script with evaluation pauses, for bench/eta_record.py: examples/ddp_runyard.py's loop (the SDK,
checkpoints every 100 steps) with a steady step and, every --eval-every steps, an evaluation that
holds every rank for --eval-s seconds, as a real validation pass does.

    torchrun --nproc-per-node 2 bench/eta_script.py --steps 1200 --step-s 0.03 --eval-every 150 --eval-s 4
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import runyard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1200)
parser.add_argument("--step-s", type=float, default=0.03)
parser.add_argument("--eval-every", type=int, default=150)
parser.add_argument("--eval-s", type=float, default=4.0)
args = parser.parse_args()

dist.init_process_group("gloo")
run = runyard.init()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))

step = run.load_checkpoint({"model": model, "optimizer": optimizer})
while step < args.steps:
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(args.step_s)  # the rest of a heavier step
    step += 1
    if step % 10 == 0:
        run.log(step, loss=loss.detach())
    if step % args.eval_every == 0:
        time.sleep(args.eval_s)  # the evaluation: no step advances meanwhile
    if step % 100 == 0 or step == args.steps or run.should_stop(step):
        run.save_checkpoint(step, {"model": model, "optimizer": optimizer})
    if run.should_stop(step):
        break

run.finish()
dist.barrier()
dist.destroy_process_group()
