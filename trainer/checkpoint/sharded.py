"""Sharded checkpoints through PyTorch Distributed Checkpoint (DCP): every rank writes its own
shards in parallel and a checkpoint saved on N ranks loads on M.

A training state that holds DTensors (an FSDP2 model's and optimizer's sharded state dicts) is
split in two (:func:`split`): the DTensors go to DCP, which writes one ``__<rank>_0.distcp`` file
per rank and the ``.metadata`` that says where every shard lives; the rest (RNG states, the
config, the optimizer's hyper-parameters and step counters, plain numbers) is small and the same
on every rank, and rank 0 writes it to ``unsharded.pt`` with the paths where the DTensors go back.
runyard's manifest (trainer/checkpoint/manager.py) is written last and lists every file's size and
sha256, the world size and each sharded tensor's global shape and dtype, so that a damaged or
missing shard, a manifest that does not match DCP's metadata, or a checkpoint of another model's
shapes is refused by name before any rank loads.

Loading never unpickles anything but tensors and plain data: ``unsharded.pt`` is read with
``torch.load(weights_only=True)``, DCP reads tensors with ``weights_only=True`` itself, its
``.metadata`` (a pickle) is read by :class:`_MetadataUnpickler`, which knows only DCP's metadata
classes, and a checkpoint item stored as pickled bytes is refused (runyard never writes one).

Every function here that takes ``group`` is collective over it: every rank calls it at the same
point. :func:`checkpoint_group` is a gloo group of its own, so that a save's collectives run on
the writer thread while training's run on the default group.

Importing this module is cheap: PyTorch Distributed Checkpoint (1-2 s, sympy) is imported by the
functions that use it. The SDK (runyard.py) loads the module up front with the rest of its own,
while runyard's packages hold their names; a script that never shards never pays for DCP.
"""

from __future__ import annotations

import enum
import hashlib
import io
import json
import os
import pickle
import struct
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from trainer.checkpoint.io import CheckpointError, _tensor_bytes

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.tensor import DTensor

DCP_METADATA_FILE = ".metadata"  # DCP's own name (torch.distributed.checkpoint.filesystem)
Path_ = tuple[Any, ...]  # a value's place in the nested state: dict keys and list indices

_GROUP: dist.ProcessGroup | None = None


def checkpoint_group() -> dist.ProcessGroup:
    """The checkpoints' own gloo group over every rank (collective the first time it is asked for).

    A save runs its collectives on the checkpoint writer thread while the training thread runs
    its own on the default group (NCCL on GPUs): the two must not share a group. gloo also moves
    the small plans and hashes through CPU memory, as torchtitan's async checkpointing does.
    """
    global _GROUP
    if _GROUP is None:
        _GROUP = dist.new_group(backend="gloo")
    return _GROUP


def _is_dtensor(value: Any) -> bool:
    """A DTensor exists only once ``torch.distributed.tensor`` is imported: until then, no value is one."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def has_shards(state: Any) -> bool:
    """Whether ``state`` holds a DTensor anywhere (then it is saved sharded)."""
    return any(_is_dtensor(value) for _, value in _leaves(state, ()))


def _leaves(obj: Any, path: Path_) -> Iterator[tuple[Path_, Any]]:
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _leaves(value, (*path, i))
    else:
        yield path, obj


def dcp_key(path: Path_) -> str:
    """A DTensor's key in DCP's files: its path joined with dots, as DCP flattens a state itself
    (``model.blocks.0.attn.qkv.weight``, ``optimizer.state.blocks.0.attn.qkv.weight.exp_avg``)."""
    return ".".join(str(part) for part in path)


def split(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[list[Any]]]:
    """Take the DTensors out of ``state``.

    Returns:
        The DTensors by :func:`dcp_key`; the state without them (its dicts, lists and tuples
        rebuilt, its other values shared, not copied); and the DTensors' paths, in the order of
        the first, for :func:`put_back`.

    Raises:
        CheckpointError: Two paths give the same key (``a.b`` / ``c`` and ``a`` / ``b.c``).
    """
    shards: dict[str, torch.Tensor] = {}
    paths: list[list[Any]] = []

    def walk(obj: Any, path: Path_) -> Any:
        if _is_dtensor(obj):
            key = dcp_key(path)
            if key in shards:
                raise CheckpointError(f"two sharded tensors of the state would be saved as {key!r}")
            shards[key] = obj
            paths.append(list(path))
            return _REMOVED
        if isinstance(obj, Mapping):
            kept = {k: walk(v, (*path, k)) for k, v in obj.items()}
            return {k: v for k, v in kept.items() if v is not _REMOVED}
        if isinstance(obj, (list, tuple)):
            items = [walk(v, (*path, i)) for i, v in enumerate(obj)]
            if any(item is _REMOVED for item in items):
                raise CheckpointError(f"{dcp_key(path)}: a sharded tensor in a list is not supported")
            return type(obj)(items)
        return obj

    rest: dict[str, Any] = walk(dict(state), ())
    return shards, rest, paths


_REMOVED = object()


def put_back(rest: dict[str, Any], paths: list[list[Any]], shards: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The inverse of :func:`split`: put each of ``shards`` back into ``rest`` at its path."""
    for path in paths:
        node = rest
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = shards[dcp_key(tuple(path))]
    return rest


def shard_table(shards: Mapping[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """Each sharded tensor's global shape and dtype, for the manifest."""
    return {key: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for key, t in shards.items()}


def local_digest(shards: Mapping[str, torch.Tensor], prefix: str) -> str:
    """sha256 over this rank's pieces of the tensors whose key starts with ``prefix``: each one's
    key, dtype, global shape and offset in it (a length-prefixed JSON header), then its bytes.

    Rank 0 hashes the ranks' digests in rank order into the checkpoint's parameters digest: equal
    weights sharded the same way give equal digests (a checkpoint resharded to another number of
    ranks has another digest for the same weights).
    """
    h = hashlib.sha256()
    for key in sorted(k for k in shards if k.startswith(prefix)):
        t = shards[key]
        local = t.to_local() if _is_dtensor(t) else t  # type: ignore[attr-defined]  # a DTensor
        offsets = _global_offset(t)
        piece = local.detach().to("cpu").contiguous()
        header = json.dumps([key, str(piece.dtype), list(t.shape), offsets]).encode()
        h.update(struct.pack("<Q", len(header)) + header)
        h.update(_tensor_bytes(piece))
    return h.hexdigest()


def _global_offset(t: torch.Tensor) -> list[int]:
    if not _is_dtensor(t):
        return [0] * t.dim()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC0415 - private, only here

    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)  # type: ignore[attr-defined]  # a DTensor
    return [int(o) for o in offset]


class ShardStager:
    """A CPU copy of a rank's shards for the writer, into buffers made at the first save and kept
    for the next (pinned on a GPU, so the copies from the device run at full speed).

    Built on torch's own staging helpers (``_create_cpu_state_dict`` / ``_copy_state_dict``, what
    DCP's ``BlockingAsyncStager`` is built on), not on DCP's
    ``DefaultStager``: on torch 2.11 its second ``stage()`` of the same DTensors raised
    ``KeyError: <class 'type'>`` in its deepcopy (seen on an H200, NCCL, 2026-11-28), so an FSDP
    run on a GPU failed at its second checkpoint.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._layout: list[tuple[str, torch.Size, torch.dtype]] = []

    def stage(self, shards: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copy ``shards`` (DTensors) to the CPU; a copy on a GPU is complete when this returns."""
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict  # noqa: PLC0415 - DCP's modules only for a sharded state

        on_gpu = any(t.device.type == "cuda" for t in shards.values())
        # A 0-dim DTensor is not copied by those helpers (its "buffer" is the tensor itself).
        scalars = {k: t for k, t in shards.items() if t.dim() == 0}
        tensors = {k: t for k, t in shards.items() if t.dim() > 0}
        layout = [(k, cast("DTensor", t).to_local().shape, t.dtype) for k, t in tensors.items()]
        if layout != self._layout:  # the first save, or another model's state
            # On the CPU an empty DTensor like each shard (its local part only, no copy: the helper
            # deep-copies a CPU DTensor before emptying it, one more copy of the shard per save of
            # a fresh manager, 2.1 s against 0.7 s of stall in bench_sharded_checkpoint).
            self._buffers = (_create_cpu_state_dict(tensors, pin_memory=True) if on_gpu
                             else {k: torch.empty_like(t) for k, t in tensors.items()})
            self._layout = layout
        staged: dict[str, torch.Tensor] = _copy_state_dict(tensors, self._buffers, non_blocking=on_gpu)
        if on_gpu:
            torch.cuda.current_stream().synchronize()
        staged.update({k: t.to("cpu", copy=True) for k, t in scalars.items()})
        return {k: staged[k] for k in shards}

    def clear(self) -> None:
        """Free the buffers (the manager is closed)."""
        self._buffers, self._layout = {}, []


def write_shards(staged: Mapping[str, torch.Tensor], folder: Path, group: dist.ProcessGroup) -> list[tuple[str, int]]:
    """Collective: every rank writes its shards of ``staged`` into ``folder`` through DCP (rank 0
    also DCP's ``.metadata``), each file fsync'd.

    Returns:
        The files this rank wrote, with their sizes (``.metadata`` on rank 0 included).
    """
    from torch.distributed.checkpoint import FileSystemWriter  # noqa: PLC0415 - DCP (1-2 s) only when sharded
    from torch.distributed.checkpoint import save as dcp_save  # noqa: PLC0415 - DCP (1-2 s) only when sharded

    writer = FileSystemWriter(folder, single_file_per_rank=True, sync_files=True, thread_count=1)
    dcp_save(dict(staged), storage_writer=writer, process_group=group)
    rank = dist.get_rank()
    mine = sorted(name for name in os.listdir(folder) if name.startswith(f"__{rank}_") and name.endswith(".distcp"))
    if rank == 0:
        mine.append(DCP_METADATA_FILE)
    return [(name, (folder / name).stat().st_size) for name in mine]


# -- reading ----------------------------------------------------------------------------------

# What DCP's .metadata pickle is made of (torch 2.6-2.13), and nothing else.
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


def _enum_member(cls: Any, name: Any) -> enum.Enum:
    """What ``builtins.getattr`` stands for in the metadata pickle: Python 3.11.0-3.11.4 (Debian
    12's python3 among them) pickle an enum member as ``getattr(TheEnum, "NAME")``, the others as
    ``TheEnum(value)``. Only a member of one of the metadata's own enums is looked up; any other
    ``getattr`` is refused."""
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str)
            and (cls.__module__, cls.__qualname__) in _METADATA_CLASSES and name in cls.__members__):
        raise pickle.UnpicklingError(f"getattr({getattr(cls, '__qualname__', type(cls).__name__)}, {name!r}) "
                                     "is not part of a checkpoint's metadata")
    return cls.__members__[name]


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata and refuses any other global (a crafted ``.metadata`` cannot run
    code). dtypes are the ``torch.<dtype>`` attributes that are dtypes; ``getattr`` is an enum
    member's lookup (:func:`_enum_member`)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def read_metadata(folder: Path) -> Metadata:
    """DCP's ``.metadata`` of ``folder``, unpickled by :class:`_MetadataUnpickler`.

    Raises:
        CheckpointError: Missing, unreadable or not DCP's metadata.
    """
    from torch.distributed.checkpoint.metadata import Metadata  # noqa: PLC0415 - DCP (1-2 s) only when sharded

    path = folder / DCP_METADATA_FILE
    try:
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{DCP_METADATA_FILE}: unreadable: {exc}") from exc
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise CheckpointError(f"{DCP_METADATA_FILE}: not DCP's metadata")
    return metadata


def check_metadata(metadata: Metadata, manifest: Mapping[str, Any]) -> str:
    """Whether DCP's metadata matches runyard's manifest: every file it points into is listed, and
    its tensors are exactly the manifest's, with the same shapes and dtypes. Returns the first
    difference, or ``""``."""
    files = manifest["files"]
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if name not in files:
            return f"{DCP_METADATA_FILE} points into {name!r}, which the manifest does not list"
    table: dict[str, dict[str, Any]] = manifest.get("shards") or {}
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # noqa: PLC0415 - DCP (1-2 s) only when sharded

    tensors = dict(metadata.state_dict_metadata)
    for key in sorted(set(table) | set(tensors)):
        md, entry = tensors.get(key), table.get(key)
        if entry is None:
            return f"{DCP_METADATA_FILE} holds {key!r}, which the manifest does not list"
        if not isinstance(md, TensorStorageMetadata):
            return f"{key}: in the manifest, not a tensor in {DCP_METADATA_FILE}"
        shape, dtype = list(md.size), str(md.properties.dtype).removeprefix("torch.")
        if shape != entry.get("shape") or dtype != entry.get("dtype"):
            return (f"{key}: {DCP_METADATA_FILE} says {dtype} {shape}, "
                    f"the manifest {entry.get('dtype')} {entry.get('shape')}")
    return ""


def check_targets(manifest: Mapping[str, Any], targets: Mapping[str, torch.Tensor]) -> str:
    """Whether the checkpoint's sharded tensors fit the run's: the same keys, global shapes and
    dtypes. Returns the first difference (naming the tensor), or ``""``."""
    table: dict[str, dict[str, Any]] = manifest.get("shards") or {}
    for key in sorted(set(table) | set(targets)):
        entry, target = table.get(key), targets.get(key)
        if entry is None:
            return f"{key}: this run has it, the checkpoint does not (a checkpoint of another model)"
        if target is None:
            return f"{key}: in the checkpoint, not in this run (a checkpoint of another model)"
        shape, dtype = list(target.shape), str(target.dtype).removeprefix("torch.")
        if (shape, dtype) != (entry["shape"], entry["dtype"]):
            return (f"{key}: the checkpoint's is {entry['dtype']} {entry['shape']}, this run's {dtype} {shape} "
                    "(a checkpoint of another model)")
    return ""


def read_shards(folder: Path, targets: Mapping[str, torch.Tensor], group: dist.ProcessGroup | None) -> None:
    """Collective: load the checkpoint's sharded tensors into ``targets`` in place, each rank
    reading what its own pieces need (DCP reshards: N ranks' files into M ranks' pieces). Without
    a process group (one process, no torch.distributed), that process reads everything."""
    from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415 - DCP (1-2 s) only when sharded
    from torch.distributed.checkpoint import load as dcp_load  # noqa: PLC0415 - DCP (1-2 s) only when sharded
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # noqa: PLC0415 - DCP (1-2 s) only when sharded
    from torch.distributed.checkpoint.planner import ReadItem  # noqa: PLC0415 - DCP (1-2 s) only when sharded

    class Reader(FileSystemReader):
        """DCP's file reader with :func:`read_metadata` instead of a bare ``pickle.load``."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            if kwargs.get("rank") is not None:  # a per-rank metadata file: runyard never writes one
                raise CheckpointError("per-rank DCP metadata is not a runyard checkpoint")
            return read_metadata(Path(self.path))

    class TensorsOnlyPlanner(DefaultLoadPlanner):
        """DCP's load planner, refusing an item stored as pickled bytes (runyard stores none)."""

        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            raise CheckpointError(f"{read_item.dest_index.fqn}: stored as pickled bytes, which runyard never writes")

    dcp_load(dict(targets), storage_reader=Reader(folder), planner=TensorsOnlyPlanner(), process_group=group)


def tensors_at(state: Mapping[str, Any], paths: list[list[Any]]) -> dict[str, torch.Tensor]:
    """What a sharded checkpoint loads into: the tensors of ``state`` at the checkpoint's ``paths``
    (DTensors, or whole tensors on a run that is not sharded), by :func:`dcp_key`, and every other
    DTensor of ``state`` (which the checkpoint then lacks: :func:`check_targets` says so)."""
    found: dict[str, torch.Tensor] = {}
    for path in paths:
        node: Any = state
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, torch.Tensor):
            found[dcp_key(tuple(path))] = node
    for place, value in _leaves(state, ()):
        if _is_dtensor(value):
            found.setdefault(dcp_key(place), value)
    return found
