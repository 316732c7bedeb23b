"""The floor runyard's launch and recovery are measured against: a bare torchrun script that does
what the mlp-digits workload does before and in its first step, with nothing of runyard.

    python -m torch.distributed.run --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:PORT bench/floor_ddp.py OUT.json

Each rank imports torch, joins the gloo process group, reads scikit-learn's bundled digits (as
trainer/datasets.py does), builds the same MLP (hidden 128) under DDP with Adam and takes one
optimizer step of batch 64; rank 0 then writes ``{"first_step_at": wall-clock seconds}`` to
OUT.json. bench/floor.py starts it and times it; bench_recovery.py and bench_spine.py run it side
by side with runyard.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    spec = importlib.util.find_spec("sklearn")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return torch.tensor(data[:, :-1] / 16.0, dtype=torch.float32), torch.tensor(data[:, -1], dtype=torch.long)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x, y = digits()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = DDP(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    xb, yb = x[rank::world][:64], y[rank::world][:64]
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(ddp(xb), yb).backward()
    optimizer.step()
    first_step_at = time.time()
    if rank == 0:
        Path(sys.argv[1]).write_text(json.dumps({"first_step_at": first_step_at, "pid": os.getpid()}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
