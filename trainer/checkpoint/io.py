"""What the checkpoint manager reads and hashes besides DCP's own work: file hashes, the digest of
a model's parameters, fsync, and the two places where PyTorch Distributed Checkpoint would
unpickle more than plain data (its ``.metadata`` file and the non-tensor values of a state
dict), each replaced by a reader that accepts only what a checkpoint holds.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from trainer import TrainerError


class CheckpointError(TrainerError):
    """A checkpoint could not be written, verified or loaded."""


_READ_CHUNK = 8 << 20

# What a DCP ``.metadata`` pickle may name: DCP's own dataclasses, torch.Size and dtypes, the
# layout helper, a path (the checkpoint id). Nothing here runs code when constructed.
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "ChunkStorageMetadata", "BytesStorageMetadata", "TensorStorageMetadata",
        "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` file, refusing any global but DCP's metadata types."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a checkpoint's .metadata")


def read_metadata(path: Path) -> Metadata:
    """DCP's ``.metadata`` of a checkpoint folder, through the restricted unpickler.

    Raises:
        CheckpointError: It cannot be read, names a global DCP's metadata does not use, or is
            not a ``Metadata``.
    """
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except Exception as exc:
        raise CheckpointError(f".metadata: unreadable: {type(exc).__name__}: {exc}") from exc
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict) \
            or not isinstance(metadata.storage_data, dict):
        raise CheckpointError(".metadata: unreadable: not DCP metadata")
    return metadata


class VerifiedReader(FileSystemReader):
    """DCP's file reader, but ``.metadata`` goes through :func:`read_metadata` (DCP's own reader
    calls ``pickle.load``). Tensors DCP itself reads with ``torch.load(weights_only=True)``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self.path) / ".metadata")
        metadata.storage_meta = StorageMeta(load_id=self.load_id)
        return metadata


class PlainDataLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, but a state dict's non-tensor values (an optimizer's ``param_groups``,
    a GradScaler's numbers) are read with ``torch.load(weights_only=True)``: DCP's default reads
    them with ``weights_only=False``, which would run whatever a crafted file names."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{read_item.dest_index.fqn}: not plain data: {type(exc).__name__}") from exc
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def params_digest(model_state: Mapping[str, torch.Tensor]) -> str:
    """Hash a (full, unsharded) model state dict so that equal weights give equal digests.

    sha256 over, in state-dict order, each tensor's key name, dtype and shape (a
    length-prefixed JSON header) followed by its raw bytes. Entries that are not tensors are
    skipped. (A saved checkpoint's digest is :func:`shards_digest`, which needs no gather.)
    """
    h = hashlib.sha256()
    for key, value in model_state.items():
        if not isinstance(value, torch.Tensor):
            continue
        t = value.detach().to("cpu").contiguous()
        header = json.dumps([str(key), str(t.dtype), list(t.shape)]).encode()
        h.update(struct.pack("<Q", len(header)) + header)
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def shards_digest(folder: Path, metadata: Metadata, prefix: str) -> str:
    """The digest of a saved model's parameters, read from the checkpoint's files: sha256 over
    the entries under ``prefix`` (``"model."``) in key and offset order, each its key, chunk
    offsets and sizes, then its bytes as DCP wrote them. Equal weights saved on the same number of
    ranks with the same strategy give equal digests; no rank ever holds the whole model."""
    h = hashlib.sha256()
    items = sorted(((index.fqn, tuple(index.offset or ()), info) for index, info in metadata.storage_data.items()
                    if index.fqn.startswith(prefix)), key=lambda item: (item[0], item[1]))
    for fqn, offset, info in items:
        header = json.dumps([fqn, list(offset), info.length]).encode()
        h.update(struct.pack("<Q", len(header)) + header)
        with open(folder / info.relative_path, "rb") as f:
            f.seek(info.offset)
            left = info.length
            while left > 0:
                chunk = f.read(min(left, _READ_CHUNK))
                if not chunk:
                    raise CheckpointError(f"{info.relative_path}: shorter than .metadata says")
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_READ_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])  # hashlib releases the GIL on large buffers: threads hash in parallel
    return h.hexdigest()
