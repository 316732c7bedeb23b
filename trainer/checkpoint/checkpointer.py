"""A run's checkpoints: the one implementation behind the SDK's ``Run``, for your own scripts and
the built-in workloads alike.

On top of the manager (trainer/checkpoint/manager.py, which writes and verifies folders) it
decides what a checkpoint holds besides your state (the step, every rank's RNG state, the run
config's hash), resumes from the checkpoint the scheduler chose (falling back past refused
ones, restoring the RNG states, moving an abandoned lineage aside), says when a save is due
(every N steps, every T seconds by the ranks' agreed clocks, at the end) and hands rank 0's
database writer the records and events (trainer/checkpoint/history.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from db.file_versions import sha256_of
from db.vocabulary.layout import step_dir_name, superseded_dir
from trainer import rng
from trainer.checkpoint.history import AdoptedFile, CheckpointHistory, event
from trainer.checkpoint.io import CheckpointError
from trainer.checkpoint.manager import CheckpointManager
from trainer.checkpoint.writing import SaveResult

if TYPE_CHECKING:
    from db.vocabulary.config import CheckpointConfig, RunConfig
    from trainer.context import RunContext
    from trainer.process.distributed import DistInfo
    from trainer.reporting.control import ControlChannel
    from trainer.reporting.reporter import DatabaseWriter

logger = logging.getLogger(__name__)

LATE_FLAG = "checkpoint_due"  # the control channel's flag for a time-based save


class Stateful(Protocol):
    """What a checkpoint saves and restores: a module, an optimizer, a GradScaler, an adapter."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> Any: ...


def as_state(value: Any) -> Any:
    """Modules, optimizers, schedulers and adapters become their state dicts (a DDP model its
    module's, so that the keys do not depend on the wrapper); plain values are kept."""
    if isinstance(value, nn.parallel.DistributedDataParallel):
        value = value.module
    if hasattr(value, "state_dict") and callable(value.state_dict):
        return value.state_dict()
    return value


def load_into(target: Any, saved: Any) -> None:
    """Put ``saved`` back into ``target``: ``load_state_dict`` where it has one, else a dict is
    updated in place (plain numbers such as a data position travel in a dict)."""
    if isinstance(target, nn.parallel.DistributedDataParallel):
        target = target.module
    if hasattr(target, "load_state_dict"):
        target.load_state_dict(saved)
    elif isinstance(target, dict):
        target.update(saved)


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


class Checkpointer:
    """Resume, save and the save schedule of one process of a run.

    :meth:`resume` and :meth:`save` are collective (every rank calls them at the same steps);
    rank 0 writes, in the background, atomically, with a manifest. A save with
    ``defer_snapshot`` also takes its snapshot in the background, while the next step's forward
    and backward run: then :meth:`before_update` must come before ``optimizer.step()``.

    Args:
        ctx: Where this process belongs (checkpoint folder, resume point, attempt).
        info: This process's rank, world size and device.
        config: The ``[checkpoint]`` section (async writes, schedule, retention).
        channel: The process's control channel: with ``every_seconds`` the ranks agree there on
            whether a time-based save is due (their clocks differ).
        writer: Rank 0's database writer when the run is managed (records and events), else None.
        run_config: The run's config when known: its hash and text are saved, and a resume from
            a checkpoint of another config (a fork) says so.
    """

    def __init__(self, ctx: RunContext, info: DistInfo, config: CheckpointConfig, channel: ControlChannel,
                 writer: DatabaseWriter | None, run_config: RunConfig | None = None) -> None:
        self.ctx = ctx
        self.info = info
        self.config = config
        self.writer = writer
        self.run_config = run_config
        self.manager = CheckpointManager(ctx.checkpoint_dir, is_writer=info.is_main, async_save=config.async_save,
                                         on_complete=self._completed)
        if writer is not None and ctx.run_id is not None:
            CheckpointHistory(ctx.run_id, ctx.attempt, config, self.manager).attach(writer)
        if config.every_seconds:
            channel.add_flag(LATE_FLAG, self._late)  # every rank, at the same point: the flags stay matched
        self._last_save = time.monotonic()
        self.last_saved: int | None = None  # the newest checkpoint of this lineage

    # -- callbacks (writer thread, or resume) -----------------------------------------------

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

    def resume(self, state: Mapping[str, Any]) -> int:
        """Load the checkpoint the scheduler chose for this attempt into ``state``, if any.

        A damaged checkpoint is refused (an event, its record marked) and the newest verified
        one before it is used. Each value of ``state`` is loaded in place (:func:`load_into`);
        one the checkpoint lacks keeps its fresh state, with a log line. This rank's RNG states
        are restored, and rank 0 moves the checkpoints newer than the one loaded aside.

        Returns:
            The step of the checkpoint (the loop continues after it), or 0 from scratch.

        Raises:
            CheckpointError: No checkpoint at or below the resume step verifies and loads.
        """
        resume_dir, resume_step = self.ctx.resume_dir, self.ctx.resume_step
        if resume_dir is None or resume_step is None:
            return 0
        source = CheckpointManager(resume_dir, is_writer=False, on_refused=self._refused if self.info.is_main else None)
        try:
            # A sharded checkpoint loads into the run's own sharded state dicts, resharded to its ranks.
            step, saved = source.load(resume_step, targets=lambda: {k: as_state(v) for k, v in state.items()})
        except CheckpointError as exc:
            raise CheckpointError(f"cannot resume from {resume_dir} step {resume_step}: {exc}") from exc
        if self.run_config is not None and saved.get("config_hash", self.run_config.config_hash()) \
                != self.run_config.config_hash():
            logger.info("resuming from a checkpoint written with another config (a fork)")
        for key, target in state.items():
            if key in saved:
                load_into(target, saved[key])
            else:
                logger.info("checkpoint has no %r state; it starts fresh", key)
        rng_states = saved.get("rng") or []
        if self.info.rank < len(rng_states):
            rng.restore(rng_states[self.info.rank])
        else:
            logger.warning("checkpoint has RNG states for %d ranks; rank %d keeps its seed", len(rng_states),
                           self.info.rank)
        message = f"resumed from step {step} ({Path(resume_dir) / step_dir_name(step)})"
        logger.info(message)
        if self.writer is not None:
            self.writer.put("resumed", step)
            self.writer.put("event", event("resume", message))
        if self.info.is_main:
            supersede_after(step, self.ctx, self.manager, self.writer)
        self._last_save = time.monotonic()
        self.last_saved = step
        return step

    # -- a file the script saved itself ------------------------------------------------------

    def adopt(self, path: Path, step: int) -> None:
        """Rank 0: hash ``path`` (on this thread) and record it as this run's checkpoint at ``step``."""
        if not self.info.is_main:
            return
        began = time.monotonic()
        st = path.stat()
        digest = sha256_of(path)
        if (path.stat().st_size, path.stat().st_mtime) != (st.st_size, st.st_mtime):
            raise CheckpointError(f"{path} changed while it was hashed: adopt it once it is completely written")
        adopted = AdoptedFile(path=str(path), step=step, size=st.st_size, mtime=st.st_mtime, sha256=digest,
                              hash_s=time.monotonic() - began, at=time.time())
        logger.info("adopted %s as the checkpoint of step %d (%.1f MB, sha256 %s)", path, step, st.st_size / 1e6,
                    digest[:12])
        if self.writer is not None:
            self.writer.put("adopted", adopted)

    # -- saving -----------------------------------------------------------------------------

    def due(self, step: int, agreed: Mapping[str, bool], last: bool = False) -> bool:
        """Whether to save at ``step`` by the schedule: at the ``last`` step, every
        ``every_steps``, or when the ranks agreed (``agreed``, the channel's answer at this step)
        that ``every_seconds`` passed since the last save."""
        every_steps = self.config.every_steps
        # The channel's answer at this step is what the ranks' clocks said at the end of the
        # previous one: right after a save there it is stale, and saving again would be a waste.
        late = agreed.get(LATE_FLAG, False) and self.last_saved != step - 1
        return last or late or bool(every_steps and step % every_steps == 0)

    def _late(self) -> bool:
        """This rank's clock says a time-based save is due (ranks' clocks differ: they agree)."""
        return time.monotonic() - self._last_save >= self.config.every_seconds

    def save(self, step: int, state: Mapping[str, Any], metrics: Mapping[str, float | torch.Tensor] | None = None,
             defer_snapshot: bool = False) -> None:
        """Collective: gather every rank's RNG state, then rank 0 snapshots ``state`` and writes.

        Values of ``state`` with a ``state_dict`` are saved as it (an FSDP adapter's holds DTensors:
        then every rank writes its own shards, trainer/checkpoint/sharded.py); ``state["model"]``
        must be the model, whose parameters' digest identifies the checkpoint. One-element tensors in ``metrics`` (a
        loss still on the device) are read here.
        """
        rng_states: list[Any] = [None] * self.info.world_size
        if self.info.world_size > 1 and dist.is_initialized():
            dist.all_gather_object(rng_states, rng.capture())
        else:
            rng_states = [rng.capture()]
        payload = {key: as_state(value) for key, value in state.items()}
        payload.update(step=step, rng=rng_states, world_size=self.info.world_size)
        if self.run_config is not None:  # what it was trained with (a state key of the same name wins)
            payload.setdefault("config_hash", self.run_config.config_hash())
            payload.setdefault("config", self.run_config.to_json())
        numbers = {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in (metrics or {}).items()}
        self.manager.save(step, payload, metrics=numbers, defer_snapshot=defer_snapshot)
        self._last_save = time.monotonic()
        self.last_saved = step

    def prepare(self, state: Mapping[str, Any]) -> None:
        """On a GPU, pin the snapshot's CPU buffers in the background now rather than make the
        first checkpoint wait for it (about a second for a 1.5 GB state). Call it once the
        state's tensors exist (an optimizer's after its first step). Only plain or DDP modules
        and optimizers are prepared: an FSDP adapter's state dict is a collective gather."""
        if self.info.device.type != "cuda":
            return
        local = {key: as_state(value) for key, value in state.items() if isinstance(value, (nn.Module, Optimizer))}
        if local:
            self.manager.prepare(local)

    def before_update(self) -> None:
        """Before ``optimizer.step()`` (or anything else that edits the saved tensors): wait
        until a deferred save has copied them."""
        self.manager.wait_snapshot()

    def wait(self) -> None:
        """Block until the in-flight save is durable (raises its error if it failed)."""
        self.manager.wait()

    def close(self) -> None:
        """Wait for the in-flight save (the last checkpoint must be durable before exit)."""
        self.manager.close()
