"""The same DDP script after adopting runyard's SDK (compare with examples/ddp_plain.py):
per-rank metrics in the dashboard, verified checkpoints, graceful stop, resume.

Under runyard: `runyard submit examples/script.toml`. Alone, it still runs:
`torchrun --nproc-per-node 2 examples/ddp_runyard.py`.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import runyard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

dist.init_process_group("gloo")
run = runyard.init()
rank = dist.get_rank()
torch.manual_seed(0)

x, y = load_digits(return_X_y=True)
data = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))
sampler = DistributedSampler(data, seed=0, drop_last=True)
loader = DataLoader(data, batch_size=64, sampler=sampler, drop_last=True)
model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

step = run.load_checkpoint({"model": model, "optimizer": optimizer})
epoch = step // len(loader)
while step < args.steps:
    sampler.set_epoch(epoch)
    for i, (xb, yb) in enumerate(loader):
        if epoch * len(loader) + i < step:
            continue  # already trained on before the checkpoint
        loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 10 == 0:
            run.log(step, loss=loss.detach())  # copied to the host without waiting for the GPU
        if step % 50 == 0 or step == args.steps or run.should_stop(step):  # logs every 10: name the step
            run.save_checkpoint(step, {"model": model, "optimizer": optimizer})
        if step == args.steps or run.should_stop(step):
            break
    if run.should_stop():
        break
    epoch += 1

run.finish()
dist.barrier()
dist.destroy_process_group()
