"""Checkpoint manager: sharded checkpoints written by every rank in parallel through PyTorch
Distributed Checkpoint (DCP), atomic, and verified against a manifest before any rank loads.

As torchtitan's CheckpointManager (torchtitan/components/checkpoint.py): ``save(step)`` hands the
state dict to ``dcp.save``, or to ``dcp.async_save`` on a gloo process group of its own (its
collectives run in a background thread beside training's); ``load(step=-1)`` loads the newest
good one with ``dcp.load``, which reshards a checkpoint saved on N ranks onto M. What runyard
adds is the manifest::

    root/.tmp-step-<N>-<token>/__<rank>_0.distcp   each rank's shard of the tensors (DCP, fsync'd)
    root/.tmp-step-<N>-<token>/.metadata           DCP's index, by rank 0 once every rank has written
    root/.tmp-step-<N>-<token>/extra.pt            plain data (step, RNG states, config), by rank 0
    root/.tmp-step-<N>-<token>/manifest.json       rank 0, last: every file's size and sha256
    root/step-<N>/                                 the tmp folder renamed, then the root fsync'd

A step counts only when its folder holds a manifest that matches every file in it, DCP's
``.metadata`` names only files the manifest lists, and the shapes it records are the model's.
Rank 0 checks all of that before any rank loads (:meth:`CheckpointManager.load`); a damaged
checkpoint is refused by name and the previous one is tried. Nothing is unpickled but tensors and
plain data: ``.metadata`` through a restricted unpickler, after its sha256 matched the manifest
(trainer/checkpoint/io.py), non-tensor values and ``extra.pt`` with ``weights_only=True``.

The manager does no database access; callers report through ``on_complete`` and ``on_refused``.
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
from dataclasses import dataclass
from datetime import datetime, timezone
from io import BytesIO
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from db.layout import MANIFEST_FILE, STEP_DIR, step_dir_name
from trainer import faults
from trainer.checkpoint.io import (
    CheckpointError,
    PlainDataLoadPlanner,
    VerifiedReader,
    fsync_dir,
    read_metadata,
    sha256_file,
    shards_digest,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 1: one state.pt written by rank 0; 2: DCP shards + extra.pt
EXTRA_FILE = "extra.pt"
METADATA_FILE = ".metadata"
_LEFTOVER_PREFIXES = (".tmp-", ".deleting")
_HASH_THREADS = 4


@dataclass(frozen=True)
class SaveResult:
    """A checkpoint that is durable on disk (rank 0's view).

    Attributes:
        step: The training step.
        path: The final directory, ``root/step-<N>``.
        bytes: Total size of the files in ``path``.
        manifest_sha256: sha256 of the bytes of ``manifest.json``.
        params_digest: :func:`~trainer.checkpoint.io.shards_digest` of the model's entries.
        blocked_s: Time the calling (training) thread was blocked: inside ``save()``, plus inside
            ``wait_snapshot()`` when the state was staged in the background.
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
    tmp: Path
    extra: bytes
    metrics: dict[str, float]
    params_key: str
    world_size: int
    started: float
    upload: Future[Any]
    staging: Future[Any] | None = None
    blocked_s: float = 0.0


class CheckpointManager:
    """Saves, verifies, loads and deletes the checkpoints under one root directory.

    Args:
        root: The checkpoint directory, for example ``run_dir / "checkpoints"``.
        is_writer: Whether this process is the saving run's rank 0: it writes ``extra.pt`` and
            the manifest, publishes, deletes, and removes leftovers of crashed saves. Every rank
            writes its shard; a reader (a resume source) is ``is_writer=False`` on every rank,
            and its rank 0 (of the process group) verifies before a load.
        async_save: ``dcp.async_save``: ``save()`` returns once the state is staged (or at once
            with ``defer_snapshot``); the files are written in the background.
        on_complete: Called on rank 0 with each durable checkpoint, from the background thread
            (or from ``save()`` when not async). It must not call ``save()`` or ``wait()``.
        on_refused: Called with (step, reason) for each checkpoint that ``load()`` refuses.
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
        self._stagers: dict[bool, DefaultStager] = {}  # by async staging: DCP's, kept (its buffers are reused)
        self._pg: dist.ProcessGroup | None = None  # the background saves' own gloo group
        self._finisher: ThreadPoolExecutor | None = None
        self._in_flight: Future[SaveResult | None] | None = None
        self._pending: _Job | None = None  # a job whose staging the training thread has not waited for
        self._callback_thread: int | None = None
        if is_writer:
            self.root.mkdir(parents=True, exist_ok=True)
            self._clean_leftovers()

    # -- saving ---------------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: dict[str, Any],
        *,
        extra: Mapping[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
        params_key: str = "model",
        defer_snapshot: bool = False,
    ) -> None:
        """Collective: every rank writes its shard of ``state``; rank 0 adds ``extra`` and the manifest.

        Args:
            step: The training step; the checkpoint goes to ``root/step-<step>``.
            state: DCP state dict (nested dicts of tensors, DTensors and plain values), sharded as
                the model is: ``get_state_dict``'s output, never gathered.
            extra: Plain data (numbers, strings, lists, dicts, CPU tensors) rank 0 saves beside it.
            metrics: Numbers stored in the manifest and the SaveResult (e.g. validation loss).
            params_key: The key of the model's state dict, whose entries the params digest covers.
            defer_snapshot: (async only) Return at once; DCP's stager copies the tensors to CPU
                memory in the background while training goes on. Nothing may modify them until
                :meth:`wait_snapshot` returns (call it before ``optimizer.step()``).

        Raises:
            CheckpointError: Bad arguments, or the previous background save failed, or (not
                async) this save failed.
        """
        self._refuse_reentry("save")
        started = time.perf_counter()
        job_metrics = self._check_save_args(step, state, metrics, params_key)
        self.wait()  # also re-raises the previous background save's failure
        tmp = self.root / f".tmp-step-{step}-{self._agreed_token()}"
        writer = dcp.FileSystemWriter(tmp, sync_files=True, overwrite=False)
        extra_bytes = b""
        if self.is_writer:
            buffer = BytesIO()
            torch.save(dict(extra or {}), buffer)
            extra_bytes = buffer.getvalue()
        world_size = dist.get_world_size() if dist.is_initialized() else 1
        try:
            if not self.async_save:
                done: Future[Any] = Future()
                done.set_result(dcp.save(state, storage_writer=writer))
                job = _Job(step, tmp, extra_bytes, job_metrics, params_key, world_size, started, done)
                job.blocked_s = time.perf_counter() - started
                result = self._finish(job)
                self._in_flight = Future()
                self._in_flight.set_result(result)
                return
            deferred = bool(defer_snapshot)
            response = dcp.async_save(state, storage_writer=writer, process_group=self._group(),
                                      async_stager=self._stager(deferred))
        except CheckpointError:
            raise
        except Exception as exc:
            if self.is_writer:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"saving checkpoint step {step} to {tmp} failed: {exc}") from exc
        if isinstance(response, Future):
            job = _Job(step, tmp, extra_bytes, job_metrics, params_key, world_size, started, response)
        else:  # AsyncSaveResponse: staging goes on in the background too
            job = _Job(step, tmp, extra_bytes, job_metrics, params_key, world_size, started,
                       response.upload_completion, staging=response.staging_completion)
            self._pending = job
        job.blocked_s = time.perf_counter() - started
        self._in_flight = self._background().submit(self._finish, job)

    def prepare(self, state: dict[str, Any]) -> None:
        """Nothing to do ahead of the first save: DCP's stager allocates its (on a GPU, pinned)
        CPU buffers at the first save and reuses them. Kept for the SDK's ``prepare_checkpoint``."""

    def wait_snapshot(self) -> float:
        """Block until the state given to a ``save(defer_snapshot=True)`` is staged in CPU memory.

        Call it before anything modifies that state (before ``optimizer.step()``). Cheap when
        there is nothing to wait for. The time blocked here counts in the save's ``blocked_s``.

        Returns:
            Seconds blocked.

        Raises:
            CheckpointError: Staging failed.
        """
        job, self._pending = self._pending, None
        if job is None or job.staging is None:
            return 0.0
        started = time.perf_counter()
        try:
            job.staging.result()
        except Exception as exc:
            raise CheckpointError(f"staging checkpoint step {job.step} failed: {exc}") from exc
        waited = time.perf_counter() - started
        job.blocked_s += waited
        return waited

    def wait(self) -> SaveResult | None:
        """Block until the in-flight save is durable (on rank 0: published).

        Returns:
            On rank 0, the result of the newest save not yet returned by ``wait()``; else None.

        Raises:
            CheckpointError: The save failed (the original exception is its cause).
        """
        self._refuse_reentry("wait")
        if self._pending is not None:
            self.wait_snapshot()
        future, self._in_flight = self._in_flight, None
        return None if future is None else future.result()

    def close(self) -> None:
        """Wait for the in-flight save, stop the background thread, free the staging memory."""
        try:
            self.wait()
        finally:
            if self._finisher is not None:
                self._finisher.shutdown(wait=True)
                self._finisher = None
            for stager in self._stagers.values():
                stager.close()
            self._stagers.clear()

    def _agreed_token(self) -> str:
        """A random suffix for the step's temporary folder, the same on every rank."""
        token = [secrets.token_hex(4)]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(token, src=0)
        return str(token[0])

    def _group(self) -> dist.ProcessGroup | None:
        """The background saves' gloo group (torchtitan does the same): DCP's collectives then run
        in the save thread without mixing with training's on the default group. Made under NCCL
        even for one rank: ``async_save`` refuses a group without a CPU backend."""
        if self._pg is None and dist.is_initialized():
            self._pg = dist.new_group(backend="gloo")
        return self._pg

    def _stager(self, deferred: bool) -> DefaultStager:
        if deferred not in self._stagers:
            cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            # Pinned memory (and non-blocking copies on a side stream) only on a GPU; on CPU the
            # staging copy is a plain memcpy into reused buffers.
            self._stagers[deferred] = DefaultStager(StagingOptions(
                use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=deferred,
                use_non_blocking_copy=cuda and deferred))
        return self._stagers[deferred]

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

    def _background(self) -> ThreadPoolExecutor:
        if self._finisher is None:
            self._finisher = ThreadPoolExecutor(1, thread_name_prefix="runyard-ckpt")
        return self._finisher

    def _finish(self, job: _Job) -> SaveResult | None:
        """Every rank: wait until DCP wrote the shards (rank 0's DCP returns only after every
        rank's write results reached it and it wrote ``.metadata``). Rank 0: then ``extra.pt``,
        the hashes, the manifest, the rename."""
        try:
            metadata = job.upload.result()
        except Exception as exc:
            if self.is_writer:
                shutil.rmtree(job.tmp, ignore_errors=True)
            raise CheckpointError(f"saving checkpoint step {job.step} to {job.tmp} failed: {exc}") from exc
        if not self.is_writer:
            return None
        try:
            result = self._publish_job(job, metadata)
        except Exception as exc:
            shutil.rmtree(job.tmp, ignore_errors=True)
            raise CheckpointError(f"writing checkpoint step {job.step} to {job.tmp} failed: {exc}") from exc
        logger.info("checkpoint step-%d saved: %.1f MB in %.2f s (training blocked %.3f s)",
                    result.step, result.bytes / 1e6, result.total_s, result.blocked_s)
        if self._on_complete is not None:
            self._callback_thread = threading.get_ident()
            try:
                self._on_complete(result)
            except Exception:
                logger.exception("on_complete failed for checkpoint step-%d", job.step)
            finally:
                self._callback_thread = None
        return result

    def _publish_job(self, job: _Job, metadata: Metadata) -> SaveResult:
        with open(job.tmp / EXTRA_FILE, "xb") as f:
            f.write(job.extra)
            f.flush()
            os.fsync(f.fileno())
        names = sorted(os.listdir(job.tmp))
        with ThreadPoolExecutor(_HASH_THREADS) as pool:
            hashes = dict(zip(names, pool.map(sha256_file, (job.tmp / n for n in names)), strict=True))
        digest = shards_digest(job.tmp, metadata, f"{job.params_key}.")
        sizes = {name: (job.tmp / name).stat().st_size for name in names}
        files = {name: {"bytes": sizes[name], "sha256": hashes[name]} for name in names}
        manifest = {
            "format_version": FORMAT_VERSION,
            "step": job.step,
            "world_size": job.world_size,
            "created_at": datetime.now(timezone.utc).isoformat(),
            "files": files,
            "params_key": job.params_key,
            "params_digest": digest,
            "metrics": job.metrics,
        }
        data = json.dumps(manifest, indent=2, sort_keys=True).encode()
        with open(job.tmp / MANIFEST_FILE, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(job.tmp)
        final = self._publish(job.tmp, job.step)
        total_s = time.perf_counter() - job.started
        return SaveResult(
            step=job.step, path=final, bytes=sum(sizes.values()) + len(data),
            manifest_sha256=hashlib.sha256(data).hexdigest(), params_digest=digest,
            blocked_s=job.blocked_s if self.async_save else total_s, total_s=total_s, metrics=dict(job.metrics),
        )

    def _publish(self, tmp: Path, step: int) -> Path:
        delay = faults.save_delay_s(step)  # tests hold a save "in flight" here; 0 otherwise
        if delay:
            time.sleep(delay)
        final = self.root / step_dir_name(step)
        old = None
        if final.exists() or final.is_symlink():  # an earlier attempt's step-<N>
            old = self.root / f".deleting-step-{step}-{secrets.token_hex(4)}"
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_dir(self.root)
        if old is not None:
            _remove(old)
        return final

    # -- verifying and loading ----------------------------------------------------------

    def verified_steps(self) -> list[int]:
        """Return, ascending, the steps whose directory matches its manifest (re-reads and hashes
        every file of every checkpoint)."""
        return [step for step in self.stored_steps() if self.verify(step)[0]]

    def verify(self, step: int, expected: Mapping[str, Any] | None = None) -> tuple[bool, str]:
        """Check ``root/step-<step>`` against its manifest, re-reading and hashing every file, then
        DCP's ``.metadata`` against the manifest and ``expected``, then ``extra.pt``.

        Args:
            step: The step.
            expected: The state dict the checkpoint will be loaded into (as given to
                :meth:`load`): every key must be in the checkpoint, every tensor of the same
                (global) shape.

        Returns:
            (True, "ok") or (False, reason), where reason is one of: "missing", "not a
            directory", "manifest missing", "manifest unreadable: ...", "manifest format_version
            X != 2", "manifest step X != N", "<file>: missing", "<file>: not a regular file",
            "<file>: size A != B" (on disk != manifest), "<file>: sha256 mismatch",
            "<file>: unreadable: ...", "<file>: unlisted file", ".metadata: ...", "<key>: ..."
            (not in the checkpoint, or another shape), "extra.pt: ...".
        """
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
        for name, entry in sorted(files.items()):  # every size before any hash: cheap failures first
            reason = _check_size(path / name, name, entry)
            if reason:
                return False, reason
        names = sorted(files)
        with ThreadPoolExecutor(_HASH_THREADS) as pool:
            hashes = list(pool.map(_sha256_or_error, (path / n for n in names)))
        for name, digest in zip(names, hashes, strict=True):
            if digest.startswith("unreadable"):
                return False, f"{name}: {digest}"
            if digest != files[name]["sha256"]:
                return False, f"{name}: sha256 mismatch"
        # .metadata is a pickle: it is read only now that its bytes are the ones rank 0 hashed
        # when it saved this checkpoint (a file swapped or edited since fails the hash above),
        # and even then through an unpickler that admits DCP's metadata types only.
        try:
            metadata = read_metadata(path / METADATA_FILE)
        except CheckpointError as exc:
            return False, str(exc)
        reason = _check_metadata(metadata, files) or (_check_shapes(metadata, expected) if expected else "")
        if reason:
            return False, reason
        try:
            _read_extra(path)
        except CheckpointError as exc:
            return False, str(exc)
        return True, "ok"

    def load(self, state: dict[str, Any], step: int = -1) -> tuple[int, dict[str, Any]]:
        """Collective: load a verified checkpoint into ``state`` in place, resharded to this world.

        Rank 0 verifies (:meth:`verify`, with ``state``'s keys and shapes) before any rank reads a
        shard: a requested step that fails is refused (``on_refused(step, reason)``) and the newest
        verified step below it is tried; with ``step=-1`` the newest verified step is loaded,
        refusing each newer one that fails. A checkpoint that verifies but that DCP cannot load
        (a type ``weights_only`` refuses, say) is refused the same way and the next older tried.

        Args:
            state: A DCP state dict of this world's (sharded) tensors; they are overwritten.
            step: The step to load, or -1 for the newest verified one.

        Returns:
            (step, extra): the step loaded and its ``extra`` plain data.

        Raises:
            CheckpointError: No checkpoint at or below ``step`` both verifies and loads.
        """
        if step < -1:
            raise CheckpointError(f"step={step} must be >= 0, or -1 for the newest")
        distributed = dist.is_initialized() and dist.get_world_size() > 1
        below: int | None = None  # after a load failure: only older steps
        while True:
            # Rank 0 verifies, every rank loads what it chose.
            chosen = [self._choose(step, below, state) if not distributed or dist.get_rank() == 0 else None]
            if distributed:
                dist.broadcast_object_list(chosen, src=0)
            candidate = chosen[0]
            if not isinstance(candidate, int):
                where = "" if step == -1 else f" at or below step {step}"
                raise CheckpointError(f"no verified checkpoint{where} in {self.root}")
            path = self.root / step_dir_name(candidate)
            try:
                planner = PlainDataLoadPlanner(allow_partial_load=True)  # whole keys only: verify() saw to it
                dcp.load(state, storage_reader=VerifiedReader(path), planner=planner)
                return candidate, _read_extra(path)
            except (CheckpointException, CheckpointError, RuntimeError, ValueError, OSError) as exc:
                # DCP raises on every rank when any rank failed, so every rank goes on to the next.
                first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else repr(exc)
                self._refuse(candidate, f"verified, but cannot be loaded: {first}")
            below = candidate

    def _choose(self, step: int, below: int | None, state: Mapping[str, Any]) -> int | None:
        """Rank 0: the newest step at or below ``step`` (-1: any) and below ``below`` (when set)
        that verifies, refusing the others on the way."""
        candidates = sorted(self.stored_steps(), reverse=True)
        if step != -1:
            candidates = [s for s in candidates if s < step]
            candidates.insert(0, step)
        if below is not None:
            candidates = [s for s in candidates if s < below]
        for candidate in candidates:
            ok, reason = self.verify(candidate, state)
            if ok:
                return candidate
            self._refuse(candidate, reason)
        return None

    def _refuse(self, step: int, reason: str) -> None:
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        logger.warning("checkpoint step-%d refused: %s", step, reason)
        if self._on_refused is not None:
            self._on_refused(step, reason)

    def _read_manifest(self, path: Path, step: int) -> tuple[dict[str, Any] | None, str]:
        try:
            manifest = json.loads((path / MANIFEST_FILE).read_bytes())
        except FileNotFoundError:
            return None, "manifest missing"
        except (OSError, ValueError) as exc:
            return None, f"manifest unreadable: {exc}"
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            return None, "manifest unreadable: no 'files' table"
        if manifest.get("format_version") != FORMAT_VERSION:
            return None, f"manifest format_version {manifest.get('format_version')!r} != {FORMAT_VERSION}"
        if manifest.get("step") != step:
            return None, f"manifest step {manifest.get('step')!r} != {step}"
        for required in (METADATA_FILE, EXTRA_FILE):
            if required not in manifest["files"]:
                return None, f"manifest unreadable: {required} not listed"
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
        fsync_dir(self.root)
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


def _sha256_or_error(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError as exc:
        return f"unreadable: {exc}"


def _check_metadata(metadata: Metadata, files: Mapping[str, Mapping[str, Any]]) -> str:
    """DCP's index against the manifest: every file it reads from is listed, every range inside it."""
    for index, info in metadata.storage_data.items():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or name not in files:
            return f".metadata: names {name!r} for {index.fqn}, which the manifest does not list"
        if info.offset < 0 or info.offset + info.length > files[name]["bytes"]:
            return f".metadata: {index.fqn} lies past the end of {name}"
    shards = {name for name in files if name.endswith(".distcp")}
    named = {info.relative_path for info in metadata.storage_data.values()}
    if shards - named:
        return f".metadata: does not name {sorted(shards - named)[0]}, which the manifest lists"
    return ""


def _check_shapes(metadata: Metadata, expected: Mapping[str, Any]) -> str:
    """The checkpoint holds every entry of ``expected`` (a DCP state dict), tensors of the same
    shape. A top-level key the checkpoint has nothing of (a GradScaler new in a fork) is let
    through: it keeps its fresh state."""
    flat, mappings = flatten_state_dict(dict(expected))
    present = {key.split(".", 1)[0] for key in metadata.state_dict_metadata}
    for key, value in flat.items():
        saved = metadata.state_dict_metadata.get(key)
        if saved is None:
            if str(mappings[key][0]) not in present:
                continue
            return f"{key}: not in the checkpoint"
        if isinstance(value, torch.Tensor):
            if not isinstance(saved, TensorStorageMetadata):
                return f"{key}: not a tensor in the checkpoint"
            if tuple(saved.size) != tuple(value.shape):
                return f"{key}: shape {list(saved.size)} in the checkpoint != {list(value.shape)} here"
    return ""


def _read_extra(path: Path) -> dict[str, Any]:
    try:
        extra = torch.load(path / EXTRA_FILE, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise CheckpointError(f"{EXTRA_FILE}: cannot be loaded with weights_only=True: {_load_error_line(exc)}") \
            from exc
    if not isinstance(extra, dict):
        raise CheckpointError(f"{EXTRA_FILE}: not a dict")
    return extra


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
