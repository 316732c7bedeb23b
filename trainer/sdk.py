"""The SDK for your own torchrun script: a few lines give it per-rank metrics in the dashboard,
verified checkpoints, graceful stops and one-click resume.

    import trainer

    run = trainer.init()                       # after (or instead of) init_process_group
    run.watch(ddp_model)                       # optional: straggler and desync checks
    state = {"model": model, "optimizer": opt}
    start = run.load_checkpoint(state)         # the step to continue after (0 when fresh)
    for step in range(start + 1, max_steps + 1):
        loss = train_step(...)
        run.log(step, loss=loss.item())        # every rank, the same steps and keys
        if step % 100 == 0 or run.should_stop():
            run.save_checkpoint(step, state)
        if run.should_stop():                  # SIGTERM: cancel, pause or preemption
            break
    run.finish()

Outside runyard (a plain ``torchrun train.py``) the same calls work: metrics go to the log,
checkpoints to ``./checkpoints``, and nothing is written to a database.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from db.config import CheckpointConfig, SupervisionConfig, config_from_json
from db.layout import RunPaths, step_dir_name
from trainer import pdeathsig, rng
from trainer.checkpoint import CheckpointError, CheckpointHistory, CheckpointManager, event, supersede_after
from trainer.context import RunContext, context_from_env
from trainer.lifecycle import StopSignal, register_stack_dumps, write_finished, write_stopped
from trainer.monitoring import Monitor
from trainer.reporter import MetricReporter

logger = logging.getLogger(__name__)


def _as_state(value: Any) -> Any:
    """Modules, optimizers and schedulers become their state dicts; the rest is kept."""
    if hasattr(value, "state_dict") and callable(value.state_dict):
        if isinstance(value, torch.nn.parallel.DistributedDataParallel):
            value = value.module
        return value.state_dict()
    return value


class Run:
    """A handle on this process's place in a runyard run. Create it with :func:`init`."""

    def __init__(self, ctx: RunContext, checkpoint_config: CheckpointConfig,
                 supervision: SupervisionConfig | None = None):
        self.ctx = ctx
        self.rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        self.world_size = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
        self.reporter = MetricReporter(ctx, self.rank, self.world_size)
        self._stop = StopSignal()
        self._stop.install()
        self._monitor = Monitor(supervision or SupervisionConfig(), self.rank, self.world_size, _device(),
                                self.reporter, self._stop)
        self._stacks = register_stack_dumps(ctx.attempt_dir, self.rank)
        self._checkpoint_config = checkpoint_config
        writer = self.reporter.writer
        self._manager = CheckpointManager(
            ctx.checkpoint_dir, is_writer=self.rank == 0, async_save=checkpoint_config.async_save,
            on_complete=(lambda result: writer.put("checkpoint", result)) if writer else None,
        )
        if writer is not None and ctx.run_id is not None:
            CheckpointHistory(ctx.run_id, ctx.attempt, checkpoint_config, self._manager).attach(writer)
        self._last_step = 0
        self._last_checkpoint: int | None = None
        self._stopping = False
        self._finished = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def managed(self) -> bool:
        """True when the scheduler launched this process (metrics go to the dashboard)."""
        return self.ctx.managed

    # -- metrics ------------------------------------------------------------------------------

    def watch(self, model: torch.nn.Module) -> None:
        """Optional, once, before training: check the ranks' health on ``model`` (your DDP model).

        Adds a DDP communication hook that times each rank's way to the gradient all-reduce
        (``pre_sync_s``; a rank that stays slower than the others is reported as a straggler)
        and compares a checksum of the replicas' parameters every
        ``supervision.desync_check_every`` steps. Both ride in :meth:`log`'s all-gather.
        """
        self._monitor.watch(model)

    def log(self, step: int, **metrics: float | torch.Tensor) -> None:
        """Report this rank's metrics at ``step`` (its memory is added).

        Collective: every rank calls it at the same steps with the same keys. One small
        all-gather, which nobody waits for, brings them to rank 0; it is read during the next
        step and written off the training thread. The stop flag rides along, so the next
        :meth:`should_stop` costs nothing. One-element tensors (``loss=loss.detach()``) are
        fine and cheaper than ``loss.item()``: they are copied to the host without waiting
        for the GPU, and read a step later.
        """
        self._monitor.log(step, metrics, then=None if self.managed else self._print)
        self.reporter.progress(step)
        self._last_step = max(self._last_step, step)

    def _print(self, step: int, gathered: dict[int, dict[str, float]]) -> None:
        """Outside runyard, rank 0 prints what it gathered (rank 0's value / rank 1's ...)."""
        logger.info("step %d: %s", step, "  ".join(
            f"{k} " + "/".join(f"{per[k]:.4g}" for per in gathered.values()) for k in sorted(gathered[0])))

    # -- checkpoints --------------------------------------------------------------------------

    def save_checkpoint(self, step: int, state: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        """Save ``state`` (modules and optimizers are saved as their state dicts) at ``step``.

        Collective (every rank's RNG state is gathered). The training thread only waits for a
        copy to CPU memory; rank 0 writes in the background, atomically, with a manifest.
        ``state["model"]`` must be the model: its parameters' digest identifies the checkpoint.
        """
        rng_states: list[Any] = [None] * self.world_size
        if self.world_size > 1 and dist.is_initialized():
            dist.all_gather_object(rng_states, rng.capture())
        else:
            rng_states = [rng.capture()]
        payload = {key: _as_state(value) for key, value in state.items()}
        payload["step"] = step
        payload["rng"] = rng_states
        payload["world_size"] = self.world_size
        self._manager.save(step, payload, metrics=metrics or {})
        self._last_checkpoint = step

    def load_checkpoint(self, state: dict[str, Any] | None = None) -> int:
        """Restore the checkpoint the scheduler chose for this attempt, if any.

        Objects in ``state`` that have ``load_state_dict`` (model, optimizer, scheduler) are
        loaded in place; other keys are updated with the saved values.

        Returns:
            The step of the checkpoint (continue with the step after it), or 0 when there is
            nothing to resume.
        """
        if self.ctx.resume_dir is None or self.ctx.resume_step is None:
            return 0
        writer = self.reporter.writer

        def refused(step: int, reason: str) -> None:
            logger.error("checkpoint step %d refused: %s", step, reason)
            if writer is not None:
                writer.put("refused", (str(Path(self.ctx.resume_dir or ".") / step_dir_name(step)), reason))
                writer.put("event", event("checkpoint_refused", f"checkpoint step {step} refused: {reason}", "error"))

        source = CheckpointManager(self.ctx.resume_dir, is_writer=False, on_refused=refused if self.is_main else None)
        try:
            step, saved = source.load(self.ctx.resume_step)
        except CheckpointError as exc:
            raise CheckpointError(f"cannot resume from {self.ctx.resume_dir} step {self.ctx.resume_step}: {exc}") from exc
        for key, target in (state or {}).items():
            if key not in saved:
                continue
            if isinstance(target, torch.nn.parallel.DistributedDataParallel):
                target = target.module
            if hasattr(target, "load_state_dict"):
                target.load_state_dict(saved[key])
            elif isinstance(target, dict):
                target.update(saved[key])
        ranks = saved.get("rng") or []
        if self.rank < len(ranks):
            rng.restore(ranks[self.rank])
        if writer is not None:
            writer.put("resumed", step)
            writer.put("event", event("resume", f"resumed from step {step}"))
        if self.is_main and self.managed:
            supersede_after(step, self.ctx, self._manager, writer)
        self._last_step = self._last_checkpoint = step
        self._monitor.begin(step)
        logger.info("resumed from checkpoint step %d", step)
        return step

    # -- stopping -----------------------------------------------------------------------------

    def should_stop(self) -> bool:
        """True on every rank once any rank got SIGTERM (cancel, pause, preemption): save a
        checkpoint and leave the loop.

        Collective: every rank calls it at the same points (once per step is enough; it sends
        one small all-reduce that nobody waits for, or reads the flag that rode in :meth:`log`).
        The answer is what the ranks had one step ago, the same on every rank; once true it
        stays true.
        """
        self._stopping = self._stopping or self._stop.agreed()
        return self._stopping

    def finish(self) -> None:
        """Wait for the last checkpoint to be durable and flush the metrics. Call it once at the end."""
        if self._finished:
            return
        self._finished = True
        self._monitor.close()  # the last log's exchange: its metrics get written
        self.reporter.finishing()
        self._manager.close()
        if self._stop.received_at is not None and self.is_main:
            write_stopped(self.ctx.attempt_dir, self._last_step, self._last_checkpoint, self._stop.received_at)
        self.reporter.close()
        if self.managed:
            write_finished(self.ctx.attempt_dir, self.rank, self._last_step)
        self._stacks.close()


def _device() -> torch.device:
    """The device this script trains on, as far as the SDK can tell (for memory metrics)."""
    nccl = dist.is_initialized() and dist.get_backend() == "nccl"
    if nccl or (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init(backend: str = "auto") -> Run:
    """Join runyard's run (or run locally) and return the handle.

    Initialises the default process group from torchrun's environment when the script has not
    done so (``backend``: auto picks nccl with CUDA, else gloo).
    """
    # Under runyard the rank dies with torchrun's agent. trainer/script_runner.py already armed
    # it for a script the scheduler launched; arming twice is harmless.
    pdeathsig.arm_under_agent()
    ctx = context_from_env()
    if not os.environ.get("RUNYARD_RUN_DIR"):
        ctx = RunContext(run_id=None, attempt=1, db_url=None, run_dir=Path.cwd(), attempt_dir=Path.cwd() / "runyard-logs")
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1 and not dist.is_initialized():
        from trainer.distributed import setup

        setup(backend)
    checkpoint_config, supervision = CheckpointConfig(), SupervisionConfig()
    config_file = RunPaths(ctx.run_dir).config
    if ctx.managed and config_file.exists():
        config = config_from_json(config_file.read_text())
        checkpoint_config, supervision = config.checkpoint, config.supervision
    run = Run(ctx, checkpoint_config, supervision)
    logger.info("runyard %s: rank %d/%d, run %s attempt %d, started %s", "managed" if ctx.managed else "local",
                run.rank, run.world_size, ctx.run_id, ctx.attempt, time.strftime("%H:%M:%S"))
    return run
