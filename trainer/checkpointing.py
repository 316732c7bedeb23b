"""Checkpoints of a managed run: the manager (trainer/checkpoint.py) plus their history in the
database and the retention policy.

Rank 0's database writer thread records every durable checkpoint, then applies retention:
keep the last N, the best K by a metric, and every pinned one; never the only verified one.
Deleted checkpoints stay in the history, marked deleted with the reason.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from sqlalchemy import Connection, select, update
from torch import nn
from torch.optim import Optimizer

from db.config import CheckpointConfig, RunConfig
from db.layout import step_dir_name, superseded_dir
from db.models import Attempt, Checkpoint, Event
from trainer import TrainerError, rng
from trainer.checkpoint import CheckpointError, CheckpointInfo, CheckpointManager, SaveResult, select_kept
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


class CheckpointHistory:
    """Writes checkpoint records and events for one attempt, from the database writer thread."""

    def __init__(self, run_id: int, attempt: int, config: CheckpointConfig, manager: CheckpointManager):
        self.run_id = run_id
        self.attempt = attempt
        self.config = config
        self.manager = manager

    def attach(self, writer: DatabaseWriter) -> None:
        writer.register("checkpoint", self.record)
        writer.register("event", self.events)
        writer.register("resumed", self.resumed)
        writer.register("refused", self.refused)
        writer.register("moved", self.moved)

    # -- handlers (writer thread) -----------------------------------------------------------

    def record(self, conn: Connection, results: list[SaveResult]) -> list[Callable[[], None]]:
        """Insert the checkpoints' rows and apply retention; returns the folder deletions, which
        the writer runs only after the transaction commits."""
        now = time.time()
        for result in results:
            # A checkpoint of an abandoned lineage at the same step was just replaced on disk.
            conn.execute(
                update(Checkpoint)
                .where(Checkpoint.run_id == self.run_id, Checkpoint.step == result.step,
                       Checkpoint.path == str(result.path), Checkpoint.deleted.is_(False))
                .values(deleted=True, deleted_at=now, deleted_reason=f"replaced by attempt {self.attempt}")
            )
            conn.execute(
                Checkpoint.__table__.insert().values(
                    run_id=self.run_id, attempt=self.attempt, step=result.step, path=str(result.path),
                    bytes=result.bytes, sha256=result.manifest_sha256, params_digest=result.params_digest,
                    metrics_json=json.dumps({k: _finite_or_none(v) for k, v in result.metrics.items()}),
                    blocked_s=result.blocked_s, total_s=result.total_s, created_at=now,
                    verified=True, pinned=False, deleted=False,
                )
            )
        return self._apply_retention(conn, now)

    def events(self, conn: Connection, events: list[dict[str, Any]]) -> None:
        for e in events:
            conn.execute(Event.__table__.insert().values(run_id=self.run_id, attempt=self.attempt, at=e["at"],
                                                         level=e["level"], kind=e["kind"], message=e["message"]))

    def resumed(self, conn: Connection, steps: list[int]) -> None:
        conn.execute(update(Attempt).where(Attempt.run_id == self.run_id, Attempt.number == self.attempt)
                     .values(resume_step=steps[-1]))

    def moved(self, conn: Connection, moves: list[tuple[str, str]]) -> None:
        for source, target in moves:
            conn.execute(update(Checkpoint).where(Checkpoint.run_id == self.run_id, Checkpoint.path == source,
                                                  Checkpoint.deleted.is_(False)).values(path=target))

    def refused(self, conn: Connection, refusals: list[tuple[str, str]]) -> None:
        """Mark refused checkpoints (by path: a fork's may belong to its parent run)."""
        for path, reason in refusals:
            conn.execute(update(Checkpoint).where(Checkpoint.path == path, Checkpoint.deleted.is_(False))
                         .values(verified=False, refused_reason=reason))

    def _apply_retention(self, conn: Connection, now: float) -> list[Callable[[], None]]:
        """Mark the checkpoints retention lets go as deleted; returns the deletions of their
        folders, to run after the commit (a rollback must not leave rows for folders that are gone)."""
        rows = conn.execute(
            select(Checkpoint.id, Checkpoint.step, Checkpoint.verified, Checkpoint.pinned, Checkpoint.metrics_json,
                   Checkpoint.path)
            .where(Checkpoint.run_id == self.run_id, Checkpoint.deleted.is_(False))
        ).all()
        own_root = str(self.manager.root)
        # Superseded checkpoints (moved aside when the run resumed from an older one) are not
        # part of the current lineage: retention leaves them alone.
        rows = [r for r in rows if str(Path(r.path).parent) == own_root]
        infos = [
            CheckpointInfo(step=r.step, verified=bool(r.verified), pinned=bool(r.pinned),
                           metric=json.loads(r.metrics_json or "{}").get(self.config.best_metric))
            for r in rows
        ]
        keep_last = self.config.keep_last
        if keep_last == 0:
            return []  # keep everything
        kept = select_kept(infos, keep_last, self.config.keep_best, self.config.best_mode)
        deletions: list[Callable[[], None]] = []
        for r in rows:
            if r.step in kept:
                continue
            deletions.append(functools.partial(self._delete_folder, r.step))
            conn.execute(update(Checkpoint).where(Checkpoint.id == r.id).values(
                deleted=True, deleted_at=now,
                deleted_reason=f"retention: not among the last {keep_last}, the best {self.config.keep_best} "
                               f"by {self.config.best_metric}, or pinned"))
        return deletions

    def _delete_folder(self, step: int) -> None:
        self.manager.delete(step)
        logger.info("checkpoint step %d deleted by retention", step)


def _finite_or_none(value: float) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def event(kind: str, message: str, level: str = "info") -> dict[str, Any]:
    return {"at": time.time(), "kind": kind, "message": message, "level": level}


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
