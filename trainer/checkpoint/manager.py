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
module does no collectives, and it never touches the database; callers report through the
``on_complete`` and ``on_refused`` callbacks. The byte-level work (the snapshot copy, the
hashing writer, the parameters digest) is in trainer/checkpoint/io.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from db.vocabulary.layout import MANIFEST_FILE, STATE_FILE, STEP_DIR, UNSHARDED_FILE, step_dir_name
from trainer.checkpoint import sharded
from trainer.checkpoint.io import (
    CheckpointError,
    _fsync_dir,
    _HashingFile,
    _save_without_zip_crc,
    _sha256_file,
    _StableMemory,
    _Stager,
    params_digest,
)
from trainer.faults import SaveFaults

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # a whole state in state.pt
SHARDED_FORMAT_VERSION = 2  # DCP's shards, .metadata and unsharded.pt
_LEFTOVER_PREFIXES = (".tmp-", ".deleting")


@dataclass(frozen=True)
class SaveResult:
    """A checkpoint that is durable on disk.

    Attributes:
        step: The training step.
        path: The final directory, ``root/step-<N>``.
        bytes: Total size of the files in ``path`` (``state.pt`` and ``manifest.json``).
        manifest_sha256: sha256 of the bytes of ``manifest.json``.
        params_digest: :func:`params_digest` of ``state[params_key]``.
        blocked_s: Time the calling (training) thread was blocked: inside ``save()``, plus
            inside ``wait_snapshot()`` when the snapshot was taken in the background.
        total_s: From the ``save()`` call to the rename being durable.
        metrics: The metrics given to ``save()``, also stored in the manifest.
    """

    step: int
    path: Path
    bytes: int
    manifest_sha256: str
    params_digest: str
    blocked_s: float
    total_s: float
    metrics: dict[str, float]


@dataclass
class _Job:
    step: int
    snapshot: dict[str, Any]
    metrics: dict[str, float]
    params_key: str
    started: float
    blocked_s: float = 0.0
    # Set once ``snapshot`` is a private CPU copy (at once, unless the writer takes it); its
    # CUDA part may still be landing until the ``copied`` events complete.
    snapshot_taken: threading.Event = field(default_factory=threading.Event)
    snapshot_error: BaseException | None = None
    # Deferred on CUDA: where training stood at save() (the copies start after it), and where
    # the copies end (training's next parameter update waits for it, on the device).
    ready: dict[torch.device, torch.cuda.Event] = field(default_factory=dict)
    copied: dict[torch.device, torch.cuda.Event] = field(default_factory=dict)
    # A sharded state: its DTensors by DCP key (``snapshot`` holds the rest and their paths).
    shards: dict[str, torch.Tensor] | None = None


class CheckpointManager:
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

    def _hasher(self) -> ThreadPoolExecutor:
        if self._hash_pool is None:
            self._hash_pool = ThreadPoolExecutor(1, thread_name_prefix="runyard-ckpt-hash")
        return self._hash_pool

    def _stage_shards(self, shards: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A CPU copy of this rank's shards (:class:`ShardStager`: pinned buffers on a GPU, kept
        for the next save)."""
        return self._shard_stager.stage(shards)

    def _run_job(self, job: _Job) -> SaveResult | None:
        if not job.snapshot_taken.is_set():  # deferred: copy now, while the training thread goes on
            try:
                if job.shards is not None:
                    job.shards = self._stage_shards(job.shards)
                else:
                    job.snapshot, job.copied = self._stager.snapshot_beside(job.snapshot, job.ready)
            except Exception as exc:
                job.snapshot, job.snapshot_error = {}, exc
                raise CheckpointError(f"snapshot of checkpoint step {job.step} failed: {exc}") from exc
            finally:
                job.snapshot_taken.set()
            for copied in job.copied.values():
                copied.synchronize()
        try:
            if job.shards is not None:
                result = self._write_sharded(job)
                if result is None:  # not rank 0: its shards are written, rank 0 seals the folder
                    return None
            else:
                result = self._write_whole(job)
        finally:
            job.snapshot, job.shards = {}, None  # the staging buffers stay with the stagers, nothing else
        logger.info(
            "checkpoint step-%d saved: %.1f MB in %.2f s (training blocked %.3f s)",
            result.step, result.bytes / 1e6, result.total_s, result.blocked_s,
        )
        if self._on_complete is not None:
            self._callback_thread = threading.get_ident()
            try:
                self._on_complete(result)
            except Exception:
                logger.exception("on_complete failed for checkpoint step-%d", job.step)
            finally:
                self._callback_thread = None
        return result

    def _write_whole(self, job: _Job) -> SaveResult:
        tmp = self.root / f".tmp-step-{job.step}-{secrets.token_hex(4)}"
        try:
            return self._write(job, tmp)
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"writing checkpoint step {job.step} to {tmp} failed: {exc}") from exc

    def _write(self, job: _Job, tmp: Path) -> SaveResult:
        tmp.mkdir()
        writer = _HashingFile(tmp / STATE_FILE, self._hasher(), _StableMemory(job.snapshot))
        try:
            _save_without_zip_crc(job.snapshot, writer)
            digest = params_digest(job.snapshot[job.params_key])  # while the file hash catches up
            state_sha = writer.sync_and_close()
        except Exception:
            if writer.error is not None:
                raise writer.error  # noqa: B904 (the real cause, e.g. a full disk)
            raise
        finally:
            writer.close()
        files = {STATE_FILE: {"bytes": writer.bytes, "sha256": state_sha}}
        return self._seal(job, tmp, {"format_version": FORMAT_VERSION, "files": files, "params_digest": digest})

    def _write_sharded(self, job: _Job) -> SaveResult | None:
        """Every rank: write this rank's shards through DCP into the folder rank 0 names, hash them
        and hand the hashes to rank 0, which writes the rest of the state and the manifest and
        publishes the folder. Returns the result on rank 0, None on the others."""
        import torch.distributed as dist  # noqa: PLC0415 - only for a sharded state

        assert job.shards is not None
        group = sharded.checkpoint_group()
        token = [secrets.token_hex(4)]
        dist.broadcast_object_list(token, src=0, group=group)
        tmp = self.root / f".tmp-step-{job.step}-{token[0]}"
        try:
            written = sharded.write_shards(job.shards, tmp, group)  # collective: a failure is raised on every rank
        except Exception as exc:
            if self.is_writer:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"writing checkpoint step {job.step} to {tmp} failed: {exc}") from exc
        rank = dist.get_rank()
        try:  # a failure here travels to rank 0 in the gather: no rank may skip it
            mine = ([(name, size, _sha256_file(tmp / name)) for name, size in written],
                    sharded.local_digest(job.shards, f"{job.params_key}."), "")
        except Exception as exc:  # noqa: BLE001 - reported by rank 0 and raised here
            mine = ([], "", f"rank {rank}: {exc}")
        gathered: list[Any] | None = [None] * dist.get_world_size(group) if self.is_writer else None
        dist.gather_object(mine, gathered, dst=0, group=group)
        if gathered is None:
            if mine[2]:
                raise CheckpointError(f"writing checkpoint step {job.step} to {tmp} failed: {mine[2]}")
            return None
        try:
            failed = [error for _, _, error in gathered if error]
            if failed:
                raise CheckpointError("; ".join(failed))
            files = {name: {"bytes": size, "sha256": sha} for hashed, _, _ in gathered for name, size, sha in hashed}
            with open(tmp / UNSHARDED_FILE, "xb") as f:
                torch.save(job.snapshot, f)
                f.flush()
                os.fsync(f.fileno())
            files[UNSHARDED_FILE] = {"bytes": (tmp / UNSHARDED_FILE).stat().st_size,
                                     "sha256": _sha256_file(tmp / UNSHARDED_FILE)}
            digest = hashlib.sha256("".join(d for _, d, _ in gathered).encode()).hexdigest()
            return self._seal(job, tmp, {
                "format_version": SHARDED_FORMAT_VERSION, "format": "dcp", "world_size": len(gathered),
                "files": files, "params_digest": digest, "shards": sharded.shard_table(job.shards),
            })
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"writing checkpoint step {job.step} to {tmp} failed: {exc}") from exc

    def _seal(self, job: _Job, tmp: Path, manifest: dict[str, Any]) -> SaveResult:
        """Write the manifest last into ``tmp`` (its files written and fsync'd), publish the folder
        as ``step-<N>``."""
        manifest.update(step=job.step, created_at=datetime.now(timezone.utc).isoformat(), params_key=job.params_key,
                        metrics=job.metrics)
        data = json.dumps(manifest, indent=2, sort_keys=True).encode()
        with open(tmp / MANIFEST_FILE, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        final = self._publish(tmp, job.step)
        total_s = time.perf_counter() - job.started
        return SaveResult(
            step=job.step,
            path=final,
            bytes=sum(entry["bytes"] for entry in manifest["files"].values()) + len(data),
            manifest_sha256=hashlib.sha256(data).hexdigest(),
            params_digest=manifest["params_digest"],
            blocked_s=job.blocked_s if self.async_save else total_s,
            total_s=total_s,
            metrics=dict(job.metrics),
        )

    def _publish(self, tmp: Path, step: int) -> Path:
        if self._faults:
            self._faults.before_publish(step)  # tests hold a save "in flight" here
        final = self.root / step_dir_name(step)
        old = None
        if final.exists() or final.is_symlink():  # an earlier attempt's step-<N>
            old = self.root / f".deleting-step-{step}-{secrets.token_hex(4)}"
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        if old is not None:
            _remove(old)
        return final

    # -- verifying and loading ----------------------------------------------------------

    def verified_steps(self) -> list[int]:
        """Return, ascending, the steps whose directory matches its manifest.

        This re-reads and hashes every checkpoint; ``load()`` hashes only what it needs.
        """
        return [step for step in self.stored_steps() if self.verify(step)[0]]

    def verify(self, step: int) -> tuple[bool, str]:
        """Check ``root/step-<step>`` against its manifest, re-reading and hashing every file.

        Returns:
            (True, "ok") or (False, reason), where reason is one of: "missing", "not a
            directory", "manifest missing", "manifest unreadable: ...", "manifest format_version
            X is not 1 or 2", "manifest step X != N", "<file>: missing", "<file>: not a regular file",
            "<file>: size A != B" (on disk != manifest), "<file>: sha256 mismatch",
            "<file>: unreadable: ...", "<file>: unlisted file"; for a sharded checkpoint also
            ".metadata: unreadable: ..." and where DCP's metadata and the manifest differ.
        """
        return self._verify(step, 0, 1)

    def _verify(self, step: int, share: int, shares: int) -> tuple[bool, str]:
        """:meth:`verify`, hashing only every ``shares``-th file from the ``share``-th on (in name
        order): the ranks of a sharded load split the hashing among them."""
        path = self.root / step_dir_name(step)
        if not path.exists() and not path.is_symlink():
            return False, "missing"
        if path.is_symlink() or not path.is_dir():
            return False, "not a directory"
        manifest, reason = self._read_manifest(path, step)
        if manifest is None:
            return False, reason
        files: dict[str, dict[str, Any]] = manifest["files"]
        for name in sorted(os.listdir(path)):
            if name != MANIFEST_FILE and name not in files:
                return False, f"{name}: unlisted file"
        for name, entry in files.items():  # every size before any hash: cheap failures first
            reason = _check_size(path / name, name, entry)
            if reason:
                return False, reason
        for name in sorted(files)[share::shares]:
            try:
                if _sha256_file(path / name) != files[name]["sha256"]:
                    return False, f"{name}: sha256 mismatch"
            except OSError as exc:
                return False, f"{name}: unreadable: {exc}"
        if manifest["format_version"] == SHARDED_FORMAT_VERSION:
            try:
                reason = sharded.check_metadata(sharded.read_metadata(path), manifest)
            except CheckpointError as exc:
                reason = str(exc)
            if reason:
                return False, reason
        return True, "ok"

    def load(self, step: int = -1, targets: Callable[[], Mapping[str, Any]] | None = None
             ) -> tuple[int, dict[str, Any]]:
        """Load a verified checkpoint.

        A requested step that fails verification is refused (``on_refused(step, reason)``)
        and the newest verified step below it is loaded instead; with ``step=-1`` the newest
        verified step is loaded, refusing each newer one that fails.

        Args:
            step: The step to load, or -1 for the newest verified one.
            targets: For a sharded checkpoint (collective then: every rank calls ``load``), what
                to load into: the state as it will be restored (the model's and optimizer's
                sharded state dicts, at the keys the checkpoint was saved with). Its tensors at
                the checkpoint's sharded places are loaded in place, resharded to this run's
                ranks; the checkpoint is refused, naming the tensor, when their shapes differ.

        Returns:
            (step, state) of the checkpoint loaded: tensors on CPU, except a sharded
            checkpoint's, which are the ``targets``' own.

        A checkpoint that verifies but cannot be loaded with ``weights_only=True`` (a manifest
        rewritten over a truncated file, a payload with a type the allow-list refuses) is refused
        the same way, and the next older one is tried.

        Raises:
            CheckpointError: No checkpoint at or below ``step`` both verifies and loads.
        """
        if step < -1:
            raise CheckpointError(f"step={step} must be >= 0, or -1 for the newest")
        candidates = sorted(self.stored_steps(), reverse=True)
        if step != -1:
            candidates = [s for s in candidates if s < step]
            candidates.insert(0, step)
        for candidate in candidates:
            if self._sharded(candidate):
                state, reason = self._load_sharded(candidate, targets)
                if state is not None:
                    return candidate, state
                ok = False
            else:
                ok, reason = self.verify(candidate)
            if ok:
                try:
                    return candidate, self._load_verified(candidate)
                except CheckpointError as exc:
                    # It matches its manifest yet cannot be loaded: a manifest rewritten over a
                    # truncated file, a payload weights_only refuses (or a torch upgrade dropped
                    # a type from its allow-list). As good as unverified: refuse it, go older.
                    reason = str(exc)
            logger.warning("checkpoint step-%d refused: %s", candidate, reason)
            if self._on_refused is not None:
                self._on_refused(candidate, reason)
        where = "" if step == -1 else f" at or below step {step}"
        raise CheckpointError(f"no verified checkpoint{where} in {self.root}")

    def _sharded(self, step: int) -> bool:
        """Whether ``step-<step>``'s manifest says it is sharded (one that cannot be read is not:
        every rank then refuses it on its own, with the same reason)."""
        manifest, _ = self._read_manifest(self.root / step_dir_name(step), step)
        return manifest is not None and manifest["format_version"] == SHARDED_FORMAT_VERSION

    def _load_sharded(self, step: int, targets: Callable[[], Mapping[str, Any]] | None
                      ) -> tuple[dict[str, Any] | None, str]:
        """Collective: verify ``step-<step>`` (the ranks share the hashing and agree on the verdict),
        check that its tensors fit ``targets``, then load them in place. Returns the state, or
        None and the reason it was refused (the same on every rank)."""
        import torch.distributed as dist  # noqa: PLC0415 - only for a sharded checkpoint

        group = sharded.checkpoint_group() if dist.is_initialized() else None
        if group is None:
            ok, reason = self.verify(step)
        else:
            verdicts: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(verdicts, self._verify(step, dist.get_rank(group), len(verdicts)), group=group)
            ok, reason = next((v for v in verdicts if not v[0]), (True, "ok"))
        if not ok:
            return None, reason
        path = self.root / step_dir_name(step)
        manifest, _ = self._read_manifest(path, step)
        assert manifest is not None
        try:
            saved = torch.load(path / UNSHARDED_FILE, weights_only=True, map_location="cpu")
            rest, paths = saved["state"], saved["paths"]
        except Exception as exc:  # noqa: BLE001 - refused with its reason, as a whole state that will not load
            return None, (f"{path / UNSHARDED_FILE}: matches its manifest but cannot be loaded with weights_only=True: "
                          f"{_load_error_line(exc)}")
        wanted = sharded.tensors_at(targets() if targets is not None else {}, paths)
        reason = sharded.check_targets(manifest, wanted)
        if reason:
            return None, reason
        try:
            sharded.read_shards(path, wanted, group)
        except Exception as exc:  # noqa: BLE001 - DCP raises on every rank when one fails: all refuse it
            return None, f"loading the shards failed: {_load_error_line(exc)}"
        return sharded.put_back(rest, paths, wanted), ""

    def _load_verified(self, step: int) -> dict[str, Any]:
        path = self.root / step_dir_name(step) / STATE_FILE
        try:
            state: dict[str, Any] = torch.load(path, weights_only=True, map_location="cpu")
            return state
        except Exception as exc:
            raise CheckpointError(f"{path}: matches its manifest but cannot be loaded with weights_only=True: "
                                  f"{_load_error_line(exc)}") from exc

    def _read_manifest(self, path: Path, step: int) -> tuple[dict[str, Any] | None, str]:
        try:
            manifest = json.loads((path / MANIFEST_FILE).read_bytes())
        except FileNotFoundError:
            return None, "manifest missing"
        except (OSError, ValueError) as exc:
            return None, f"manifest unreadable: {exc}"
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            return None, "manifest unreadable: no 'files' table"
        version = manifest.get("format_version")
        if version not in (FORMAT_VERSION, SHARDED_FORMAT_VERSION):
            return None, f"manifest format_version {version!r} is not {FORMAT_VERSION} or {SHARDED_FORMAT_VERSION}"
        if manifest.get("step") != step:
            return None, f"manifest step {manifest.get('step')!r} != {step}"
        required = (STATE_FILE,) if version == FORMAT_VERSION else (UNSHARDED_FILE, ".metadata")
        for name in required:
            if name not in manifest["files"]:
                return None, f"manifest unreadable: {name} not listed"
        if version == SHARDED_FORMAT_VERSION and not isinstance(manifest.get("shards"), dict):
            return None, "manifest unreadable: no 'shards' table"
        for name, entry in manifest["files"].items():
            if name in ("", ".", "..", MANIFEST_FILE) or "/" in name or os.sep in name:
                return None, f"manifest unreadable: bad file name {name!r}"
            if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) or not isinstance(
                entry.get("sha256"), str
            ):
                return None, f"manifest unreadable: bad entry for {name!r}"
        return manifest, ""

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

    def stored_steps(self) -> list[int]:
        """Steps that have a ``step-<N>`` folder, verified or not (nothing is read or hashed)."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := STEP_DIR.fullmatch(n)))

    def _clean_leftovers(self) -> None:
        for name in os.listdir(self.root):
            if name.startswith(_LEFTOVER_PREFIXES):
                logger.info("removing leftover %s", self.root / name)
                _remove(self.root / name)


def _sharded_parts(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[list[Any]]] | None:
    """``sharded.split(state)`` when the state holds DTensors, else None."""
    return sharded.split(state) if sharded.has_shards(state) else None


def _load_error_line(exc: Exception) -> str:
    """The telling line of a failed ``torch.load``: the global ``weights_only`` refused, else the
    first line (torch's own messages run to a screenful of advice)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    named = [ln for ln in lines if "GLOBAL" in ln or ln.startswith(("WeightsUnpickler error", "Unsupported"))]
    line = named[0] if named else (lines[0] if lines else type(exc).__name__)
    return f"{type(exc).__name__}: {line}"[:400]


def _check_size(path: Path, name: str, entry: Mapping[str, Any]) -> str:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return f"{name}: missing"
    if not stat.S_ISREG(st.st_mode):
        return f"{name}: not a regular file"
    if st.st_size != entry["bytes"]:
        return f"{name}: size {st.st_size} != {entry['bytes']}"
    return ""


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
