"""The writer thread's half of a checkpoint save: it finishes a deferred snapshot, writes the
files (a whole state's ``state.pt``, or this rank's DCP shards), hashes them as they are written,
writes the manifest last and publishes the folder as ``step-<N>`` (trainer/checkpoint/manager.py
says how the folder is laid out).

:class:`CheckpointWriter` is a part of :class:`~trainer.checkpoint.manager.CheckpointManager`,
whose ``__init__`` sets the attributes it names; the manager is the class to use.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from db.vocabulary.layout import MANIFEST_FILE, STATE_FILE, UNSHARDED_FILE, step_dir_name
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
from trainer.checkpoint.loading import FORMAT_VERSION, SHARDED_FORMAT_VERSION
from trainer.faults import SaveFaults

logger = logging.getLogger(__name__)


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


class CheckpointWriter:
    """What the writer thread does with a save (a part of ``CheckpointManager``)."""

    root: Path
    is_writer: bool
    async_save: bool
    _on_complete: Callable[[SaveResult], None] | None
    _stager: _Stager
    _shard_stager: sharded.ShardStager
    _hash_pool: ThreadPoolExecutor | None
    _callback_thread: int | None
    _faults: SaveFaults | None

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


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
