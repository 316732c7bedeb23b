"""The checkpoint writer's byte-level tools: the snapshot of a training state into reused CPU
staging memory (:class:`_Stager`), ``torch.save`` without torch's zip CRC32 into a file that
hashes what it writes as it writes it (:class:`_HashingFile`), the digest of a model's
parameters (:func:`params_digest`), and fsync helpers. trainer/checkpoint/manager.py's
``CheckpointManager`` puts them together; docs/benchmarks-journal.md ("Checkpoint save") says why
each is the way it is.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import hashlib
import json
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import numpy
import torch

from trainer import TrainerError


class CheckpointError(TrainerError):
    """A checkpoint could not be snapshotted, written, verified or loaded."""


_SMALL_WRITE = 1 << 20  # writes below this are gathered in a buffer
_BUFFER_LIMIT = 8 << 20  # the gathered buffer is written out at this size
_WRITEBACK_EVERY = 64 << 20  # start the kernel's write-back of the file every this many bytes
_READ_CHUNK = 8 << 20
_COPY_CHUNK = 8 << 20  # snapshot memcpy work unit, shared out among the copy threads
# torch's zip CRC32 option is process-wide; this serialises our brief changes to it.
_CRC_OPTION_LOCK = threading.Lock()
_ATOMS = (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device, torch.Size)


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor (any dtype, no numpy)."""
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def params_digest(model_state: Mapping[str, torch.Tensor]) -> str:
    """Hash a model state dict so that equal weights give equal digests on any machine.

    sha256 over, in state-dict order, each tensor's key name, dtype and shape (a
    length-prefixed JSON header) followed by its raw bytes (contiguous, on CPU).
    Entries that are not tensors (for example ``_extra_state``) are skipped.

    Args:
        model_state: A model ``state_dict()``.

    Returns:
        The hex digest.
    """
    h = hashlib.sha256()
    for key, value in model_state.items():
        if not isinstance(value, torch.Tensor):
            continue
        t = value.detach().to("cpu").contiguous()
        header = json.dumps([str(key), str(t.dtype), list(t.shape)]).encode()
        h.update(struct.pack("<Q", len(header)) + header)
        h.update(_tensor_bytes(t))  # hashlib releases the GIL on large buffers
    return h.hexdigest()


class _StableMemory:
    """The address ranges of a snapshot's tensor storages, which outlive ``torch.save``."""

    def __init__(self, snapshot: Any) -> None:
        ranges = sorted({(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in _tensors(snapshot)})
        self._starts = [start for start, _ in ranges]
        self._ends = [start + size for start, size in ranges]

    def holds(self, view: memoryview) -> bool:
        address = numpy.frombuffer(view, dtype=numpy.uint8).__array_interface__["data"][0]
        i = bisect.bisect_right(self._starts, address) - 1
        return i >= 0 and address + view.nbytes <= self._ends[i]


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


class _HashingFile:
    """A write-only file for ``torch.save`` that computes the sha256 of what it writes.

    Small writes (zip headers) are gathered into one buffer. Large ones (tensor storages)
    go straight to the file while a helper thread hashes the same memory, in order; when
    that memory is the snapshot's (it outlives the call), ``write()`` returns without waiting
    for the hash, so hashing and writing overlap (both release the GIL). Every
    ``_WRITEBACK_EVERY`` bytes the kernel is told to start writing the file back
    (``POSIX_FADV_DONTNEED``), so the final fsync has little left to do.
    """

    def __init__(self, path: Path, hasher: ThreadPoolExecutor, stable: _StableMemory) -> None:
        self._file = open(path, "xb", buffering=0)  # noqa: SIM115 (closed in close())
        self._hasher = hasher  # one worker: hashes run in the order they are queued
        self._stable = stable
        self._sha = hashlib.sha256()
        self._hashes: list[Future[None]] = []
        self._pending = bytearray()
        self._advised = 0
        self.bytes = 0
        self.error: BaseException | None = None  # torch.save hides a failing write()'s exception
        self.on_first_write: Callable[[], None] | None = None

    def write(self, data: Any) -> int:
        callback = self.on_first_write
        if callback is not None:
            self.on_first_write = None
            callback()
        try:
            return self._write(data)
        except BaseException as exc:
            self.error = exc
            raise

    def _write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes < _SMALL_WRITE:
            self._pending += view
            if len(self._pending) >= _BUFFER_LIMIT:
                self.flush()
        else:
            self.flush()
            self._hash_and_write(view, wait=not self._stable.holds(view))
        return view.nbytes

    def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, bytearray()
            self._hash_and_write(memoryview(pending), wait=False)  # ours: kept alive by the queue

    def _hash_and_write(self, view: memoryview, wait: bool) -> None:
        hashed = self._hasher.submit(self._sha.update, view)
        self._hashes.append(hashed)
        try:
            self._write_all(view)
        finally:
            if wait:
                hashed.result()  # torch's memory: valid only until write() returns
        self.bytes += view.nbytes
        if self.bytes - self._advised >= _WRITEBACK_EVERY and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._file.fileno(), self._advised, self.bytes - self._advised, os.POSIX_FADV_DONTNEED)
            self._advised = self.bytes

    def _write_all(self, view: memoryview) -> None:
        while view.nbytes:
            written = self._file.write(view)
            view = view[written:]

    def sync_and_close(self) -> str:
        """Flush, wait for the hashes, fsync and close the file; return its sha256."""
        self.flush()
        self._wait_hashes()
        os.fsync(self._file.fileno())
        self._file.close()
        return self._sha.hexdigest()

    def close(self) -> None:
        self._wait_hashes()
        self._file.close()

    def _wait_hashes(self) -> None:
        hashes, self._hashes = self._hashes, []
        for hashed in hashes:
            hashed.result()


def _save_without_zip_crc(obj: Any, file: _HashingFile) -> None:
    """``torch.save`` without the zip CRC32 of every record.

    The manifest's sha256 covers the file, so the CRC is redundant, and torch computes it
    holding the GIL: it costs about a third of the writer's time here and slows the training
    thread. The option is process-wide but read once, when torch.save opens its zip writer,
    so it is switched off only until the first byte arrives. ``torch.load`` reads such files;
    ``unzip -t`` would report CRC errors.
    """
    serialization = torch.serialization
    stream = cast(IO[bytes], file)  # write() and flush() are all that torch.save uses
    if not hasattr(serialization, "set_crc32_options"):  # torch < 2.6
        torch.save(obj, stream)
        return
    with _CRC_OPTION_LOCK:
        previous = serialization.get_crc32_options()
        serialization.set_crc32_options(False)
        file.on_first_write = lambda: serialization.set_crc32_options(previous)
        try:
            torch.save(obj, stream)
        finally:
            file.on_first_write = None
            serialization.set_crc32_options(previous)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_READ_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _format_path(path: tuple[Any, ...]) -> str:
    return "state" + "".join(f"[{k!r}]" for k in path)


@dataclass
class _Pass:
    """What one snapshot collects while it walks the state."""

    buffers: dict[tuple[Any, ...], tuple[tuple[Any, ...], torch.Tensor]] = field(default_factory=dict)
    memo: dict[int, torch.Tensor] = field(default_factory=dict)
    cuda_devices: set[torch.device] = field(default_factory=set)
    memcpys: list[tuple[int, int, int]] = field(default_factory=list)  # (dst, src, bytes)
    allocate_only: bool = False  # find or make the CUDA tensors' pinned buffers, copy nothing


class _Stager:
    """Copies a nested state to CPU memory, reusing the buffers of the previous snapshot.

    Reusing buffers turns the copy into a plain memcpy (no page faults on fresh memory),
    which is most of the training thread's stall. CPU tensors are copied in chunks by a few
    threads (``ctypes.memmove`` releases the GIL); torch's own ``copy_`` splits a copy over
    the intra-op threads in lock step, which stalls badly when another process holds a core.
    CUDA tensors go to pinned buffers with non-blocking copies. The previous snapshot must
    no longer be in use (one save in flight at most).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], tuple[tuple[Any, ...], torch.Tensor]] = {}
        self._copiers: ThreadPoolExecutor | None = None
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def clear(self) -> None:
        self._buffers = {}
        if self._copiers is not None:
            self._copiers.shutdown()
            self._copiers = None

    def snapshot(self, state: dict[str, Any], parallel: bool = True) -> dict[str, Any]:
        """A copy of ``state`` in CPU memory, complete on return (CUDA copies waited for).

        ``parallel``: split the CPU copies over a few threads (when the caller is waiting).
        """
        walk = _Pass()
        out: dict[str, Any] = self._copy(state, (), walk)
        self._memmove(walk.memcpys, parallel)
        for device in walk.cuda_devices:  # the copies must land before training edits the source
            torch.cuda.current_stream(device).synchronize()
        self._buffers = walk.buffers
        return out

    def reserve(self, state: dict[str, Any]) -> None:
        """Allocate now the pinned buffers that a snapshot of ``state`` would copy its CUDA
        tensors into (pinning gigabytes takes about a second; done ahead, the first checkpoint
        does not wait for it). The buffers are keyed as a snapshot of a state with this
        structure would key them."""
        walk = _Pass(allocate_only=True)
        self._copy(state, (), walk)
        self._buffers.update(walk.buffers)

    def snapshot_beside(self, state: dict[str, Any], ready: dict[torch.device, torch.cuda.Event]
                        ) -> tuple[dict[str, Any], dict[torch.device, torch.cuda.Event]]:
        """Off the training thread: copy ``state`` while training goes on.

        CPU tensors are copied by this thread alone (leaving the other cores to training). CUDA
        tensors are copied on a side stream of their device, after ``ready[device]`` (an event
        the training thread recorded when it asked for the checkpoint), so the copy engine
        moves them while the device computes the next forward and backward passes. Returns the
        copy (its CUDA part still landing) and, per device, the event that marks the copies
        done: the training stream must wait for it before it edits the tensors (the next
        optimizer step), and the copy may be read once it has completed.
        """
        walk = _Pass()
        with contextlib.ExitStack() as streams:
            for device, event in ready.items():
                side = self._streams.get(device)
                if side is None:
                    side = self._streams[device] = torch.cuda.Stream(device)
                side.wait_event(event)
                streams.enter_context(torch.cuda.stream(side))
            out = self._copy(state, (), walk)
        self._memmove(walk.memcpys, parallel=False)
        done: dict[torch.device, torch.cuda.Event] = {}
        for device in walk.cuda_devices:
            if device not in ready:  # not announced: copied on the device's current stream
                torch.cuda.current_stream(device).synchronize()
                continue
            done[device] = self._streams[device].record_event()
        self._buffers = walk.buffers
        return out, done

    def _copy(self, obj: Any, path: tuple[Any, ...], walk: _Pass) -> Any:
        if isinstance(obj, torch.Tensor):
            if id(obj) not in walk.memo:  # tied weights stay tied
                walk.memo[id(obj)] = self._copy_tensor(obj, path, walk)
            return walk.memo[id(obj)]
        if type(obj) in (dict, OrderedDict):
            return type(obj)((k, self._copy(v, (*path, k), walk)) for k, v in obj.items())
        if type(obj) in (list, tuple):
            return type(obj)(self._copy(v, (*path, i), walk) for i, v in enumerate(obj))
        if type(obj) in _ATOMS:
            return obj
        raise CheckpointError(f"{_format_path(path)}: unsupported type {type(obj).__name__} in a checkpoint")

    def _copy_tensor(self, t: torch.Tensor, path: tuple[Any, ...], walk: _Pass) -> torch.Tensor:
        t = t.detach()
        if t.layout != torch.strided or t.is_quantized or t.device.type not in ("cpu", "cuda"):
            return t if walk.allocate_only else t.to("cpu", copy=True)
        pin = t.is_cuda
        if walk.allocate_only and not pin:
            return t
        signature = (tuple(t.shape), t.stride(), t.dtype, pin)
        cached = self._buffers.get(path)
        buffer = cached[1] if cached is not None and cached[0] == signature else None
        if buffer is None:
            buffer = torch.empty_like(t, device="cpu", pin_memory=pin)
        walk.buffers[path] = (signature, buffer)
        if walk.allocate_only:
            return buffer
        if not pin and t.is_contiguous() and buffer.is_contiguous():
            walk.memcpys.append((buffer.data_ptr(), t.data_ptr(), t.numel() * t.element_size()))
        else:
            buffer.copy_(t, non_blocking=pin)
            if pin:
                walk.cuda_devices.add(t.device)
        return buffer

    def _memmove(self, memcpys: list[tuple[int, int, int]], parallel: bool = True) -> None:
        chunks = [
            (dst + offset, src + offset, min(_COPY_CHUNK, size - offset))
            for dst, src, size in memcpys
            for offset in range(0, size, _COPY_CHUNK)
        ]
        if len(chunks) < 2 or not parallel:
            for dst, src, size in chunks:
                ctypes.memmove(dst, src, size)
            return
        if self._copiers is None:
            workers = min(4, os.cpu_count() or 1)
            self._copiers = ThreadPoolExecutor(workers, thread_name_prefix="runyard-ckpt-copy")
        for _ in self._copiers.map(lambda chunk: ctypes.memmove(*chunk), chunks):
            pass
