"""mlp-digits: an MLP classifier on scikit-learn's bundled 8x8 digits (no download).

Reads top to bottom: data, model, and the hooks of the shared training loop
(:meth:`MLPDigits.setup` builds and resumes, :func:`trainer.workloads.loop.train` trains; the SDK's
``Run`` does checkpoints, stops and metrics). DDP with a DistributedSampler whose epoch is set
every epoch so each rank sees a different, reproducible shard order; all ranks share the model
seed.
The ``[train]`` techniques (AdamW, warm-up and cosine, clipping, autocast, compile) come from
trainer/techniques.py; with their defaults the run is plain Adam at a constant rate, in fp32.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

from db.vocabulary.config import MlpDigitsWorkload, RunConfig, workload_as
from db.vocabulary.layout import RunPaths
from trainer import techniques
from trainer.datasets import digits_arrays
from trainer.process.distributed import DistInfo
from trainer.workloads import loop

if TYPE_CHECKING:
    from trainer.sdk import Run

TEST_FRACTION = 0.2


def load_digits_split(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """The digits data set, scaled to [0, 1], split into a fixed train and test part."""
    x_np, y_np = digits_arrays()
    order = np.random.RandomState(seed).permutation(len(x_np))
    x = torch.tensor(x_np[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(y_np[order], dtype=torch.long)
    n_test = int(len(x) * TEST_FRACTION)
    return TensorDataset(x[n_test:], y[n_test:]), TensorDataset(x[:n_test], y[:n_test])


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@torch.no_grad()
def evaluate(model: nn.Module, test: TensorDataset, info: DistInfo) -> tuple[float, float]:
    """Accuracy and mean loss over the whole test set; each rank scores a shard, then all-reduce."""
    model.eval()
    x, y = test.tensors
    x, y = x[info.rank :: info.world_size].to(info.device), y[info.rank :: info.world_size].to(info.device)
    logits = model(x)
    totals = torch.stack([(logits.argmax(1) == y).sum().double(), F.cross_entropy(logits, y, reduction="sum").double(),
                          torch.tensor(float(len(y)), dtype=torch.float64, device=info.device)])  # on the device: NCCL
    if info.world_size > 1:
        dist.all_reduce(totals)
    model.train()
    correct, loss_sum, n = totals.tolist()
    return correct / n, loss_sum / n


class MLPDigits:
    """The mlp-digits workload (:class:`~trainer.workloads.Workload`), trained by the shared loop
    (:class:`~trainer.workloads.loop.Recipe`).

    Args:
        config: The run's config (``[workload] hidden`` and the ``[train]`` techniques).
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.tokens_per_sample: int | None = None

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds besides the step and the RNG states (the Run adds those): the
        model, the optimizer, the fp16 GradScaler, and where the data order stands (the epoch,
        and how many samples of its order were consumed)."""
        state: dict[str, Any] = {"model": self.model, "optimizer": self.optimizer,
                                 "data": {"epoch": self.epoch, "position": self.position}}
        if self.scaler is not None:
            state["scaler"] = self.scaler
        return state

    def setup(self, run: Run) -> None:
        tc, info = self.config.train, run.info
        self.info = info
        seed_everything(tc.seed)
        if tc.deterministic:
            techniques.use_deterministic_algorithms(tc)
        self.train_set, self.test_set = load_digits_split()
        # The sampler shards and shuffles; its order depends only on (seed, epoch), so a resumed
        # run rebuilds it and continues at the exact sample where the checkpoint was taken (also
        # after a retry that changed the micro-batch size).
        self.sampler: DistributedSampler[int] = DistributedSampler(
            self.train_set, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=tc.seed, drop_last=True
        )
        samples_per_step = tc.batch_size * tc.grad_accum
        if len(self.sampler) < samples_per_step:
            raise ValueError(
                f"train.batch_size x train.grad_accum = {samples_per_step} is larger than one rank's share "
                f"of the data ({len(self.sampler)} samples); lower it"
            )

        self.model = build_model(workload_as(self.config.workload, MlpDigitsWorkload).hidden).to(info.device)
        # Compiled, it shares the parameters; checkpoints keep the plain model's keys.
        # torch.compile of a module returns a module (OptimizedModule); its stubs say only "callable".
        forward_model = cast(nn.Module, torch.compile(self.model)) if tc.compile else self.model
        self.runner = DDP(forward_model) if info.world_size > 1 else forward_model
        self.optimizer = techniques.build_optimizer(self.model, tc, info.device)  # weight_decay 0: Adam, bit for bit
        self.scaler = techniques.grad_scaler(tc.precision, info.device)
        # Forward and backward of a dense MLP: 2 + 4 FLOPs per parameter and sample.
        self.flops_per_sample = 6.0 * sum(p.numel() for p in self.model.parameters())
        kept = RunPaths(run.ctx.run_dir).cpu_peak if run.managed else None  # a retry reads it, measures nothing
        self.peak_flops = techniques.peak_flops(info.device, kept=kept)
        run.watch(self.runner)
        self.epoch, self.position = 0, 0
        state = self.state()
        self.step = run.load_checkpoint(state)
        self.epoch, self.position = state["data"]["epoch"], state["data"]["position"]
        self.order: list[int] = []
        self.order_epoch = -1

    def train(self, run: Run) -> dict[str, float]:
        return loop.train(run, self, self.config.train)

    def batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The next ``grad_accum`` micro-batches of the sampler's order (the next epoch's when this
        one has too few samples left)."""
        tc = self.config.train
        samples_per_step = tc.batch_size * tc.grad_accum
        if self.position + samples_per_step > len(self.sampler):
            self.epoch, self.position = self.epoch + 1, 0
        if self.order_epoch != self.epoch:
            self.sampler.set_epoch(self.epoch)
            self.order, self.order_epoch = list(self.sampler), self.epoch
        idx = self.order[self.position : self.position + samples_per_step]
        self.position += samples_per_step
        x_all, y_all = self.train_set.tensors
        x, y = x_all[idx].to(self.info.device), y_all[idx].to(self.info.device)
        return list(zip(x.split(tc.batch_size), y.split(tc.batch_size), strict=True))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.runner(x).float(), y)

    def evaluate(self) -> dict[str, float]:
        accuracy, loss = evaluate(self.runner, self.test_set, self.info)
        return {"eval_accuracy": accuracy, "eval_loss": loss}

    def extra_metrics(self) -> dict[str, float]:
        return {"epoch": float(self.epoch)}
