"""A plain DDP training script, before runyard: `torchrun --nproc-per-node 2 examples/ddp_plain.py`.

Compare with examples/ddp_runyard.py: the same script after adopting runyard's SDK.
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

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)

x, y = load_digits(return_X_y=True)
data = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))
sampler = DistributedSampler(data, seed=0, drop_last=True)
loader = DataLoader(data, batch_size=64, sampler=sampler, drop_last=True)
model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

step, epoch = 0, 0
while step < args.steps:
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}")
        if step == args.steps:
            break
    epoch += 1

dist.barrier()
dist.destroy_process_group()
