"""The built-in workloads' one training loop: nanoGPT's, on the SDK's ``Run``.

Each workload sets up a :class:`Recipe` (its model, optimizer, batches, loss, evaluation and
checkpoint state) and hands it to :func:`train`. The loop reads as nanoGPT's does: the learning
rate, the step's micro-batches through forward and backward (the gradient sync on the last one),
clip and step. runyard's part follows each step in one call, :meth:`Bookkeeper.step_done`:
the metrics every ``train.log_every`` steps (``run.log``, one small collective nobody waits
for), the evaluation every ``train.eval_every`` (``run.log_rank0``), the ``[checkpoint]``
schedule and the stop signal (one agreement of the ranks a step). Fault injection for runyard's
own tests is one object, present only under ``RUNYARD_FAULTS=1`` (trainer/faults.py).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from trainer import techniques
from trainer.faults import StepFaults
from trainer.reporting.monitoring import Interval

if TYPE_CHECKING:
    from db.vocabulary.config import TrainConfig
    from trainer.sdk import Run

logger = logging.getLogger(__name__)


class Recipe(Protocol):
    """What a built-in workload gives the loop once its ``setup`` ran."""

    # Read-only members (what ``setup`` made): the model is the plain one, whose gradients are
    # clipped and whose state is checkpointed; the runner is what forward and backward run
    # through (DDP, FSDP or the model), whose gradient sync gradient accumulation skips on all
    # but the last micro-batch; the scaler is fp16's GradScaler or None; step is the step to
    # continue after (``run.load_checkpoint``'s answer, 0 when fresh).
    @property
    def model(self) -> nn.Module: ...
    @property
    def runner(self) -> nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def scaler(self) -> torch.amp.GradScaler | None: ...
    @property
    def step(self) -> int: ...
    @property
    def flops_per_sample(self) -> float: ...
    @property
    def tokens_per_sample(self) -> int | None: ...
    @property
    def peak_flops(self) -> float | None: ...

    def batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The ``train.grad_accum`` micro-batches (inputs, targets) of optimizer step ``step``
        (0-based), on the device."""
        ...

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One micro-batch's mean loss (run under autocast)."""
        ...

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics, the same on every rank (collective)."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds besides the step and the RNG states (the Run adds those)."""
        ...

    def extra_metrics(self) -> dict[str, float]:
        """The workload's own numbers for each metrics report (mlp-digits: the epoch)."""
        ...


def train(run: Run, recipe: Recipe, tc: TrainConfig) -> dict[str, float]:
    """Train from the step after ``recipe.step`` to ``train.max_steps``, or until a stop request
    (saved first). Returns the last step and the last evaluation, for the log."""
    model, runner, optimizer, scaler = recipe.model, recipe.runner, recipe.optimizer, recipe.scaler
    faults = StepFaults.installed(run.rank, run.ctx.attempt, run.wait_for_checkpoint)  # None outside runyard's tests
    keeper = Bookkeeper(run, recipe, tc)
    step = recipe.step
    while step < tc.max_steps:
        if faults:
            faults.before(step + 1, tc.batch_size)
        lr = techniques.lr_at(step, tc)
        techniques.set_lr(optimizer, lr)
        t_data = time.perf_counter()
        batches = recipe.batches(step)
        keeper.meter.data_wait += time.perf_counter() - t_data
        optimizer.zero_grad(set_to_none=True)
        for micro, (x, y) in enumerate(batches, 1):
            with techniques.micro_step(runner, final=micro == tc.grad_accum):  # one gradient sync a step
                with techniques.autocast(tc.precision, run.device):
                    loss = recipe.loss(x, y) / tc.grad_accum
                (scaler.scale(loss) if scaler is not None else loss).backward()
            keeper.meter.loss += loss.detach()
        run.before_update()  # a checkpoint's deferred snapshot is copied by now
        keeper.meter.grad_norm += techniques.optimizer_update(model, optimizer, scaler, tc.clip_grad_norm)
        step += 1
        if faults:
            faults.after_update(step, model.parameters())
        if keeper.step_done(step, lr):  # metrics, evaluation, checkpoint; True: a stop request
            break
        if faults:
            faults.after()
    return {"step": float(step), **keeper.evaluated}


class Bookkeeper:
    """runyard's part of each step, after the optimizer's (see the module docstring).

    Args:
        run: The SDK's handle.
        recipe: The workload (its evaluation, state and throughput numbers).
        tc: The ``[train]`` section (``log_every``, ``eval_every``, ``max_steps``).
    """

    def __init__(self, run: Run, recipe: Recipe, tc: TrainConfig):
        self.run, self.recipe, self.tc = run, recipe, tc
        self.meter = Interval()  # sums over the steps since the last metrics report
        self.evaluated: dict[str, float] = {}  # the last evaluation
        self.kept: dict[str, float | torch.Tensor] = {}  # what checkpoints keep; the loss stays on the device
        self.first_step = recipe.step + 1
        self.samples_per_step = tc.batch_size * tc.grad_accum

    def step_done(self, step: int, lr: float) -> bool:
        """After optimizer step ``step``: report, evaluate and save when due. True when the ranks
        agreed to stop (the step is saved then)."""
        run, recipe, tc = self.run, self.recipe, self.tc
        self.meter.steps += 1
        if step == self.first_step:  # the optimizer's state exists now: ready the checkpoint's buffers
            run.prepare_checkpoint(recipe.state())
        last = step == tc.max_steps
        if step % tc.log_every == 0 or last:
            metrics = self.meter.report(lr, self.samples_per_step, recipe.flops_per_sample, recipe.peak_flops,
                                        recipe.scaler, tokens_per_sample=recipe.tokens_per_sample)
            self.kept["loss"] = metrics["loss"]
            run.log(step, **metrics, **recipe.extra_metrics())
            self.meter = self.meter.next()  # what follows (evaluation aside) counts as the next steps'
        if (tc.eval_every and step % tc.eval_every == 0) or last:
            t_eval = time.perf_counter()
            self.evaluated = recipe.evaluate()
            self.meter.excluded += time.perf_counter() - t_eval  # evaluation is not part of a step
            self.kept.update(self.evaluated)
            run.log_rank0(step, **self.evaluated)
            if run.is_main and run.managed:  # (unmanaged, log_rank0 prints them)
                logger.info("step %d: %s", step,
                            ", ".join(f"{key.replace('_', ' ')} {value:.4f}" for key, value in self.evaluated.items()))
        # Save when the schedule says so or when any rank got SIGTERM; one agreement of the ranks
        # per step answers both, the same on every rank.
        stopping = run.should_stop()
        if stopping or run.checkpoint_due(step, last=last):
            run.save_checkpoint(step, recipe.state(), metrics=self.kept, defer_snapshot=True)
        if stopping:
            logger.info("SIGTERM: stopped after step %d with a checkpoint", step)
        return stopping
