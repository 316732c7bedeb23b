"""A training loop's checkpoints: resume at start, ``due()``/``save()`` in the loop, ``close()``,
on top of the manager (trainer/checkpoint/manager.py) and the history in the database
(trainer/checkpoint/history.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from db.config import RunConfig
from db.layout import step_dir_name, superseded_dir
from trainer import TrainerError, rng
from trainer.checkpoint.history import CheckpointHistory, event
from trainer.checkpoint.io import CheckpointError
from trainer.checkpoint.manager import CheckpointManager, SaveResult
from trainer.context import RunContext
from trainer.distributed import DistInfo
from trainer.lifecycle import STOP_FLAG, StopSignal, write_stopped
from trainer.reporter import DatabaseWriter

logger = logging.getLogger(__name__)

LATE_FLAG = "checkpoint_due"  # the control channel's flag for a time-based save


def supersede_after(step: int, ctx: RunContext, manager: CheckpointManager, writer: DatabaseWriter | None) -> None:
    """Rank 0, on resuming from ``step``: move this run's checkpoints newer than it (an abandoned
    lineage) out of the way, into ``checkpoints/superseded/attempt-<n>/``, so that new saves do
    not overwrite them; they stay in the history and can still be resumed."""
    target_root = superseded_dir(ctx.checkpoint_dir, ctx.attempt)
    # Only folder names are needed: verifying would re-read and hash every checkpoint.
    for newer in (s for s in manager.stored_steps() if s > step):
        source = ctx.checkpoint_dir / step_dir_name(newer)
        target = target_root / step_dir_name(newer)
        target_root.mkdir(parents=True, exist_ok=True)
        source.rename(target)
        logger.info("checkpoint step %d superseded: moved to %s", newer, target)
        if writer is not None:
            writer.put("moved", (str(source), str(target)))


class Stateful(Protocol):
    """What a checkpoint saves and restores: a module, an optimizer, a GradScaler, an adapter."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> Any: ...


class RunCheckpoints:
    """What a training loop needs: resume at start, ``due()``/``save()`` in the loop, ``close()``.

    ``due`` and ``save`` are collective: every rank calls them at the same steps. With an async
    save the writer thread also takes the snapshot while the next step's forward and backward
    run; the loop must call :meth:`before_update` before ``optimizer.step()``.
    """

    def __init__(self, config: RunConfig, ctx: RunContext, info: DistInfo, writer: DatabaseWriter | None):
        self.config = config
        self.ctx = ctx
        self.info = info
        self.writer = writer
        self.manager = CheckpointManager(
            ctx.checkpoint_dir,
            is_writer=info.is_main,
            async_save=config.checkpoint.async_save,
            on_complete=self._completed,
            on_refused=self._refused,
        )
        if writer is not None and ctx.run_id is not None:
            CheckpointHistory(ctx.run_id, ctx.attempt, config.checkpoint, self.manager).attach(writer)
        self._last_save = time.monotonic()
        self.last_saved: int | None = None  # the newest checkpoint of this lineage
        self._prepared = False

    # -- callbacks --------------------------------------------------------------------------

    def _completed(self, result: SaveResult) -> None:
        logger.debug("checkpoint step %d recorded: %.1f MB, loop blocked %.3f s, total %.2f s",
                    result.step, result.bytes / 1e6, result.blocked_s, result.total_s)
        if self.writer is not None:
            self.writer.put("checkpoint", result)

    def _refused(self, step: int, reason: str) -> None:
        logger.error("checkpoint step %d refused: %s", step, reason)
        path = Path(self.ctx.resume_dir or self.ctx.checkpoint_dir) / step_dir_name(step)
        if self.writer is not None:
            self.writer.put("refused", (str(path), reason))
            self.writer.put("event", event("checkpoint_refused",
                                           f"checkpoint step {step} refused: {reason}; falling back to an older one",
                                           "error"))

    # -- resume -----------------------------------------------------------------------------

    def resume(self, model: Stateful, optimizer: Stateful,
               extra: Mapping[str, Stateful] | None = None) -> tuple[int, int, int]:
        """Load the checkpoint the scheduler chose (falling back past refused ones).

        Args:
            model: The model (or an adapter whose ``load_state_dict`` takes the saved one).
            optimizer: The optimizer (or an adapter).
            extra: More state saved by :meth:`save` under the same names (a GradScaler ...);
                one the checkpoint lacks keeps its fresh state, with a log line.

        Returns:
            (step, epoch, samples of that epoch's order already consumed); zeros from scratch.
        """
        if self.ctx.resume_dir is None or self.ctx.resume_step is None:
            return 0, 0, 0
        source = CheckpointManager(self.ctx.resume_dir, is_writer=False,
                                   on_refused=self._refused if self.info.is_main else None)
        try:
            step, state = source.load(self.ctx.resume_step)
        except CheckpointError as exc:
            raise TrainerError(
                f"cannot resume from {self.ctx.resume_dir} step {self.ctx.resume_step}: {exc}"
            ) from exc
        if state.get("config_hash") != self.config.config_hash():
            logger.info("resuming from a checkpoint written with another config (a fork)")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        saved_extra = state.get("extra") or {}
        for name, obj in (extra or {}).items():
            if name in saved_extra:
                obj.load_state_dict(saved_extra[name])
            else:
                logger.info("checkpoint has no %r state; it starts fresh", name)
        rng_states = state["rng"]
        if self.info.rank < len(rng_states):
            rng.restore(rng_states[self.info.rank])
        else:
            logger.warning("checkpoint has RNG states for %d ranks; rank %d keeps its seed", len(rng_states), self.info.rank)
        message = f"resumed from step {step} ({Path(self.ctx.resume_dir) / step_dir_name(step)})"
        logger.info(message)
        if self.writer is not None:
            self.writer.put("resumed", step)
            self.writer.put("event", event("resume", message))
        if self.info.is_main:
            supersede_after(step, self.ctx, self.manager, self.writer)
        self._last_save = time.monotonic()
        self.last_saved = step
        return step, int(state["epoch"]), int(state["position"])

    # -- saving -----------------------------------------------------------------------------

    def due(self, step: int, last: bool, late: bool = False) -> bool:
        """Whether to save at this step: every N steps, at the end, or when ``late`` (the ranks
        agreed that ``checkpoint.every_seconds`` have passed since the last save)."""
        every_steps = self.config.checkpoint.every_steps
        return last or late or bool(every_steps and step % every_steps == 0)

    def _late(self) -> bool:
        """This rank's clock says a time-based save is due (ranks' clocks differ: they agree)."""
        return time.monotonic() - self._last_save >= self.config.checkpoint.every_seconds

    def save(self, step: int, epoch: int, position: int, model: Stateful,
             optimizer: Stateful, metrics: Mapping[str, float | torch.Tensor],
             extra: Mapping[str, Stateful] | None = None) -> None:
        """Collective: gather every rank's RNG state, then rank 0 snapshots and writes.

        ``model`` and ``optimizer`` may be adapters whose ``state_dict()`` is itself collective
        (FSDP gathers the full state to rank 0); ``extra`` names more state to save (a GradScaler
        ...), restored by :meth:`resume` given the same names.
        """
        rng_states: list[Any] = [None] * self.info.world_size
        if self.info.world_size > 1:
            dist.all_gather_object(rng_states, rng.capture())
        else:
            rng_states = [rng.capture()]
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "epoch": epoch,
            "position": position,
            "rng": rng_states,
            "world_size": self.info.world_size,
            "config_hash": self.config.config_hash(),
            "config": self.config.to_json(),
        }
        if extra:
            state["extra"] = {name: obj.state_dict() for name, obj in extra.items()}
        metrics = {k: float(v) for k, v in metrics.items()}  # a loss still on the device is read here
        self.manager.save(step, state, metrics=metrics, defer_snapshot=True)
        self._last_save = time.monotonic()
        self.last_saved = step

    def before_update(self) -> None:
        """Before ``optimizer.step()`` (or anything else that edits parameters, optimizer or
        scaler state): wait until a save started after the previous step has copied them."""
        self.manager.wait_snapshot()

    def after_step(self, step: int, last: bool, stop: StopSignal, epoch: int, position: int, model: Stateful,
                   optimizer: Stateful, metrics: Mapping[str, float | torch.Tensor],
                   extra: Mapping[str, Stateful] | None = None) -> bool:
        """Collective, once per step: save when due or when SIGTERM arrived on any rank.

        Returns:
            True when the loop must end: the ranks got SIGTERM, a checkpoint of this step is
            written, and rank 0 left ``stopped.json`` for the scheduler.
        """
        if not self._prepared:  # after the first step the optimizer's state exists
            self._prepared = True
            self._prepare(model, optimizer)
        if self.config.checkpoint.every_seconds:
            stop.channel.add_flag(LATE_FLAG, self._late)  # every rank, at its first step
        agreed = stop.channel.agree()
        stopping = agreed[STOP_FLAG]
        if self.due(step, last, agreed.get(LATE_FLAG, False)) or stopping:
            self.save(step, epoch, position, model, optimizer, metrics, extra)
        if stopping:
            logger.info("SIGTERM: stopped after step %d with a checkpoint", step)
            self.close()
            if self.info.is_main:
                write_stopped(self.ctx.attempt_dir, step, self.last_saved, stop.received_at)
        return stopping

    def _prepare(self, model: Stateful, optimizer: Stateful) -> None:
        """On a GPU, pin the snapshot's CPU buffers in the background now rather than make the
        first checkpoint wait for it (about a second for a 1.5 GB state). Only for a plain or
        DDP model, whose state dict is local; an FSDP adapter's is a collective gather."""
        if self.info.device.type == "cuda" and isinstance(model, nn.Module) and isinstance(optimizer, Optimizer):
            self.manager.prepare({"model": model.state_dict(), "optimizer": optimizer.state_dict()})

    def close(self) -> None:
        """Wait for the in-flight save (the final checkpoint must be durable before exit)."""
        self.manager.close()
