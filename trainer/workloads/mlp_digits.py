"""mlp-digits: an MLP classifier on scikit-learn's bundled 8x8 digits (no download).

Reads top to bottom: data, model, loop (:meth:`MLPDigits.setup` builds and resumes,
:meth:`MLPDigits.train` loops; the SDK's ``Run`` does checkpoints, stops and metrics). DDP with
a DistributedSampler whose epoch is set every epoch so each rank sees a different, reproducible
shard order; all ranks share the model seed.
The ``[train]`` techniques (AdamW, warm-up and cosine, clipping, autocast, compile) come from
trainer/techniques.py; with their defaults the run is plain Adam at a constant rate, in fp32.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

from db.config import RunConfig
from trainer import faults, techniques
from trainer.datasets import digits_arrays
from trainer.distributed import DistInfo
from trainer.monitoring import Interval

if TYPE_CHECKING:
    from trainer.sdk import Run

logger = logging.getLogger(__name__)

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
    """The mlp-digits workload (:class:`~trainer.workloads.Workload`).

    Args:
        config: The run's config (``[workload] hidden`` and the ``[train]`` techniques).
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    def state(self, epoch: int = 0, position: int = 0) -> dict[str, Any]:
        """What a checkpoint holds besides the step and the RNG states (the Run adds those): the
        model, the optimizer, the fp16 GradScaler, and where the data order stands (the epoch,
        and how many samples of its order were consumed)."""
        state: dict[str, Any] = {"model": self.model, "optimizer": self.optimizer,
                                 "data": {"epoch": epoch, "position": position}}
        if self.scaler is not None:
            state["scaler"] = self.scaler
        return state

    def setup(self, run: Run) -> None:
        tc, info = self.config.train, run.info
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

        self.model = build_model(self.config.workload.hidden).to(info.device)
        # Compiled, it shares the parameters; checkpoints keep the plain model's keys.
        # torch.compile of a module returns a module (OptimizedModule); its stubs say only "callable".
        forward_model = cast(nn.Module, torch.compile(self.model)) if tc.compile else self.model
        self.ddp = DDP(forward_model) if info.world_size > 1 else forward_model
        self.optimizer = techniques.build_optimizer(self.model, tc, info.device)  # weight_decay 0: Adam, bit for bit
        self.scaler = techniques.grad_scaler(tc.precision, info.device)
        run.watch(self.ddp)
        state = self.state()
        self.step = run.load_checkpoint(state)
        self.epoch, self.position = state["data"]["epoch"], state["data"]["position"]

    def train(self, run: Run) -> dict[str, float]:
        tc, info = self.config.train, run.info
        model, ddp, optimizer, scaler = self.model, self.ddp, self.optimizer, self.scaler
        x_all, y_all = self.train_set.tensors
        samples_per_step = tc.batch_size * tc.grad_accum
        step, epoch, position = self.step, self.epoch, self.position
        order: list[int] = []
        order_epoch = -1
        # Forward and backward of a dense MLP: 2 + 4 FLOPs per parameter and sample.
        flops_per_sample = 6.0 * sum(p.numel() for p in model.parameters())
        peak = techniques.peak_flops(info.device)

        iv = Interval()
        latest: dict[str, float | torch.Tensor] = {}  # the loss stays on the device until a save
        injected = faults.StepFaults(info.rank, run.ctx.attempt)
        first_step = step + 1
        while step < tc.max_steps:
            injected.before(step + 1, tc.batch_size)

            t_data = time.perf_counter()
            if position + samples_per_step > len(self.sampler):
                epoch, position = epoch + 1, 0
            if order_epoch != epoch:
                self.sampler.set_epoch(epoch)
                order, order_epoch = list(self.sampler), epoch
            iv.data_wait += time.perf_counter() - t_data
            lr = techniques.lr_at(step, tc)
            techniques.set_lr(optimizer, lr)
            optimizer.zero_grad(set_to_none=True)
            for micro in range(tc.grad_accum):
                t_data = time.perf_counter()
                idx = order[position : position + tc.batch_size]
                position += tc.batch_size
                x, y = x_all[idx].to(info.device), y_all[idx].to(info.device)
                iv.data_wait += time.perf_counter() - t_data
                # Gradients are all-reduced once per optimizer step, on the last micro-batch.
                with techniques.micro_step(ddp, final=micro == tc.grad_accum - 1):
                    with techniques.autocast(tc.precision, info.device):
                        loss = F.cross_entropy(ddp(x).float(), y) / tc.grad_accum
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                iv.loss = iv.loss + loss.detach()
            run.before_update()  # the previous step's checkpoint snapshot is taken by now
            iv.grad_norm = iv.grad_norm + techniques.optimizer_update(model, optimizer, scaler, tc.clip_grad_norm)
            faults.maybe_perturb(step + 1, info.rank, model.parameters())
            step += 1
            iv.steps += 1
            run.reporter.progress(step)
            if step == first_step:  # the optimizer's state exists now: ready the checkpoint's buffers
                run.prepare_checkpoint(self.state())

            last = step == tc.max_steps
            if step % tc.log_every == 0 or last:
                metrics = iv.report(lr, samples_per_step, flops_per_sample, peak, scaler)
                metrics["epoch"] = float(epoch)
                latest["loss"] = metrics["loss"]
                run.log(step, **metrics)
                iv = iv.next()  # what follows (evaluation aside) counts as the next steps'
            if (tc.eval_every and step % tc.eval_every == 0) or last:
                t_eval = time.perf_counter()
                accuracy, eval_loss = evaluate(ddp, self.test_set, info)
                latest["eval_accuracy"], latest["eval_loss"] = accuracy, eval_loss
                iv.excluded += time.perf_counter() - t_eval  # evaluation is not part of a step
                run.reporter.log_main(step, eval_accuracy=accuracy, eval_loss=eval_loss)
                if info.is_main:
                    logger.info("step %d: eval accuracy %.4f, eval loss %.4f", step, latest["eval_accuracy"],
                                latest["eval_loss"])
            # Save when the schedule says so or when any rank got SIGTERM; one agreement of the
            # ranks per step answers both, the same on every rank.
            stopping = run.should_stop()
            if stopping or run.checkpoint_due(step, last=last):
                run.save_checkpoint(step, self.state(epoch, position), metrics=latest, defer_snapshot=True)
            if stopping:
                logger.info("SIGTERM: stopped after step %d with a checkpoint", step)
                break
            injected.after()
        return {"step": step, "eval_accuracy": float(latest.get("eval_accuracy", float("nan")))}
