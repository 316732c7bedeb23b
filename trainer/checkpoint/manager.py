"""Checkpoint manager: asynchronous, atomic, verified checkpoints on local disk.

A whole state (one process, DDP): one writer (rank 0) snapshots it to CPU memory on the training
thread, then a background thread writes it::

    root/.tmp-step-<N>-<random>/state.pt        torch.save of the snapshot, fsync'd
    root/.tmp-step-<N>-<random>/manifest.json   written last: sizes and sha256 of the files
    root/step-<N>/                              the tmp dir renamed, then the root fsync'd

A sharded state (one that holds DTensors: FSDP2's state dicts) is saved by every rank through
PyTorch Distributed Checkpoint, each its own shards in parallel, on each rank's writer thread
(trainer/checkpoint/sharded.py): the folder holds DCP's ``__<rank>_0.distcp`` files and
``.metadata``, rank 0's ``unsharded.pt`` (the rest of the state) and the same manifest, written
last by rank 0 with every rank's file hashes (format_version 2). It loads on any number of ranks.

A step counts only when its directory holds a manifest that matches every file in it
(torchtitan's "completion marker", strengthened with hashes). The sha256 of each file is
computed from the bytes as they are written, so the writer runs near disk bandwidth;
verification re-reads and hashes. Loading uses ``torch.load(weights_only=True)`` only.

Apart from a sharded save and load (collective over :func:`sharded.checkpoint_group`), the
manager does no collectives, and it never touches the database; callers report through the
``on_complete`` and ``on_refused`` callbacks. The byte-level work (the snapshot copy, the
hashing writer, the parameters digest) is in trainer/checkpoint/io.py.

The class is in three parts: this module's :class:`CheckpointManager`, what the training thread
calls (save, wait, close, delete); trainer/checkpoint/writing.py's, what the writer thread does
with a save (snapshot, files, manifest, publish); trainer/checkpoint/loading.py's, verifying,
loading and listing what is on disk.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from db.vocabulary.layout import step_dir_name
from trainer.checkpoint import sharded
from trainer.checkpoint.io import (
    CheckpointError,
    _fsync_dir,
    _Stager,
)
from trainer.checkpoint.loading import CheckpointReader
from trainer.checkpoint.writing import CheckpointWriter, SaveResult, _Job, _remove
from trainer.faults import SaveFaults

logger = logging.getLogger(__name__)

_LEFTOVER_PREFIXES = (".tmp-", ".deleting")


class CheckpointManager(CheckpointWriter, CheckpointReader):
    """Saves, verifies, loads and deletes the checkpoints under one root directory.

    Args:
        root: The checkpoint directory, for example ``run_dir / "checkpoints"``.
        is_writer: Whether this process writes (rank 0). Other ranks' ``save()`` and
            ``delete()`` do nothing; every rank can verify and load.
        async_save: Write in a background thread; ``save()`` returns after the snapshot.
        on_complete: Called with each durable checkpoint, from the writer thread (or from
            ``save()`` when not async). It must not call ``save()`` or ``wait()``.
        on_refused: Called with (step, reason) for each checkpoint that ``load()`` refuses.

    The writer keeps its CPU staging copy of the state between saves (reusing it makes the
    next snapshot a plain memcpy); ``close()`` frees it.
    """

    def __init__(
        self,
        root: Path,
        *,
        is_writer: bool = True,
        async_save: bool = True,
        on_complete: Callable[[SaveResult], None] | None = None,
        on_refused: Callable[[int, str], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.is_writer = is_writer
        self.async_save = async_save
        self._on_complete = on_complete
        self._on_refused = on_refused
        self._stager = _Stager()
        self._shard_stager = sharded.ShardStager()
        self._executor: ThreadPoolExecutor | None = None
        self._hash_pool: ThreadPoolExecutor | None = None
        self._in_flight: Future[SaveResult | None] | None = None
        self._pending_snapshot: _Job | None = None  # a deferred snapshot not yet waited for
        self._callback_thread: int | None = None  # the thread running on_complete, if any
        self._faults = SaveFaults.installed()  # None outside runyard's tests
        if is_writer:
            self.root.mkdir(parents=True, exist_ok=True)
            self._clean_leftovers()

    # -- saving ---------------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: dict[str, Any],
        *,
        metrics: dict[str, float] | None = None,
        params_key: str = "model",
        defer_snapshot: bool = False,
    ) -> None:
        """Snapshot ``state`` to CPU memory, then write it (in the background when async).

        Tensors are copied (into pinned memory when on CUDA); plain values (dicts, lists,
        tuples, int, float, bool, str, bytes, None) are copied structurally. A previous save
        still in flight is waited for first. Does nothing on non-writer ranks, unless ``state``
        holds DTensors: then every rank calls it at the same step (collective), each stages and
        writes its own shards (:class:`sharded.ShardStager`; on a GPU synchronously, whatever ``defer_snapshot``
        says) and rank 0 also the rest of the state and the manifest.

        Args:
            step: The training step; the checkpoint goes to ``root/step-<step>``.
            state: The state to save; ``state[params_key]`` must be a model state dict.
            metrics: Numbers stored in the manifest and the SaveResult (e.g. validation loss).
            params_key: The key of the model state dict that :func:`params_digest` covers.
            defer_snapshot: (async only) Return at once and let the writer thread take the
                snapshot too, while training goes on. The caller promises that nothing
                modifies the tensors in ``state`` until :meth:`wait_snapshot` returns: true
                of parameters and optimizer state between two ``optimizer.step()`` calls,
                as long as the forward pass changes no buffers (no BatchNorm in train mode).
                The training loop's stall then is only what is left of the copy when the
                next optimizer step comes, usually nothing.

        Raises:
            CheckpointError: The state cannot be checkpointed, the previous background save
                failed, or (when not async) this write failed.
        """
        parts = _sharded_parts(state)
        if not self.is_writer and parts is None:
            return
        self._refuse_reentry("save")
        started = time.perf_counter()
        job_metrics = self._check_save_args(step, state, metrics, params_key)
        self.wait()  # also re-raises the previous background write's failure
        on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        deferred = defer_snapshot and self.async_save
        if parts is not None:  # every rank: its shards; rank 0 also the rest
            shards, rest, paths = parts
            deferred = deferred and not on_gpu  # the stager waits for the device's copies
            job = _Job(step, {"state": self._stager.snapshot(rest) if self.is_writer else {}, "paths": paths},
                       job_metrics, params_key, started, shards=shards if deferred else self._stage_shards(shards))
        else:
            job = _Job(step, state if deferred else self._stager.snapshot(state), job_metrics, params_key, started)
        if not deferred:
            job.snapshot_taken.set()
        elif parts is None and on_gpu:
            device = torch.device("cuda", torch.cuda.current_device())
            job.ready[device] = torch.cuda.current_stream(device).record_event()
        job.blocked_s = time.perf_counter() - started
        if self.async_save:
            self._pending_snapshot = job if deferred else None
            self._in_flight = self._writer().submit(self._run_job, job)
        else:
            done: Future[SaveResult | None] = Future()
            done.set_result(self._run_job(job))
            self._in_flight = done

    def prepare(self, state: dict[str, Any]) -> Future[None] | None:
        """Ahead of the first save, in the background: allocate the pinned CPU buffers that
        snapshots of ``state`` (the same structure as the states that will be saved, e.g.
        ``{"model": ..., "optimizer": ...}``) copy CUDA tensors into. Optional; does nothing
        (None) unless async on the writer rank. Call it when the state's tensors exist (an
        optimizer's after its first step) and before a save is due.

        Returns:
            Done when the buffers exist (saves are queued behind it anyway).
        """
        if not (self.is_writer and self.async_save):
            return None
        self._refuse_reentry("prepare")
        return self._writer().submit(self._stager.reserve, state)

    def wait_snapshot(self) -> float:
        """Block until the state given to a ``save(defer_snapshot=True)`` is copied.

        Call it before anything modifies that state (before ``optimizer.step()``). Cheap when
        there is nothing to wait for. The time blocked here counts in the save's ``blocked_s``.

        Returns:
            Seconds blocked.

        Raises:
            CheckpointError: The snapshot failed (the state cannot be checkpointed).
        """
        job, self._pending_snapshot = self._pending_snapshot, None
        if job is None:
            return 0.0
        started = time.perf_counter()
        job.snapshot_taken.wait()
        for device, copied in job.copied.items():  # the device, not this thread, waits for the copy
            torch.cuda.current_stream(device).wait_event(copied)
        waited = time.perf_counter() - started
        job.blocked_s += waited
        error = job.snapshot_error
        if error is not None:
            raise CheckpointError(f"snapshot of checkpoint step {job.step} failed: {error}") from error
        return waited

    def wait(self) -> SaveResult | None:
        """Block until the in-flight save is durable.

        Returns:
            The result of the newest save not yet returned by ``wait()``, or None.

        Raises:
            CheckpointError: The write failed (the original exception is its cause).
        """
        self._refuse_reentry("wait")
        future, self._in_flight, self._pending_snapshot = self._in_flight, None, None
        return None if future is None else future.result()

    def close(self) -> None:
        """Wait for the in-flight save, stop the writer threads and free the staging memory."""
        try:
            self.wait()
        finally:
            for pool in (self._executor, self._hash_pool):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._executor = self._hash_pool = None
            self._stager.clear()
            self._shard_stager.clear()

    def _check_save_args(
        self, step: int, state: dict[str, Any], metrics: dict[str, float] | None, params_key: str
    ) -> dict[str, float]:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"step={step!r} must be an int >= 0")
        if not isinstance(state, dict) or not isinstance(state.get(params_key), Mapping):
            raise CheckpointError(f"state[{params_key!r}] (params_key) must be a model state dict")
        checked: dict[str, float] = {}
        for key, value in (metrics or {}).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CheckpointError(f"metrics[{key!r}]={value!r} must be a number")
            checked[str(key)] = float(value)
        return checked

    def _refuse_reentry(self, method: str) -> None:
        if threading.get_ident() == self._callback_thread:
            raise CheckpointError(f"{method}() called from on_complete would deadlock; call it from the training loop")

    def _writer(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="runyard-ckpt-writer")
        return self._executor

    # -- deleting ------------------------------------------------------------------------

    def delete(self, step: int) -> None:
        """Remove ``root/step-<step>``: renamed to a ``.deleting`` name first, then removed.

        Does nothing when the step does not exist or this process is not the writer.
        """
        if not self.is_writer:
            return
        path = self.root / step_dir_name(step)
        if not path.exists() and not path.is_symlink():
            return
        doomed = self.root / f".deleting-step-{step}-{secrets.token_hex(4)}"
        os.rename(path, doomed)
        _fsync_dir(self.root)
        _remove(doomed)


    def _clean_leftovers(self) -> None:
        for name in os.listdir(self.root):
            if name.startswith(_LEFTOVER_PREFIXES):
                logger.info("removing leftover %s", self.root / name)
                _remove(self.root / name)


def _sharded_parts(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[list[Any]]] | None:
    """``sharded.split(state)`` when the state holds DTensors, else None."""
    return sharded.split(state) if sharded.has_shards(state) else None
