"""The parts of sharded checkpoints (trainer/checkpoint/sharded.py) in one process: DCP's
``.metadata`` read without running code, the checks that refuse a checkpoint by name before
any rank loads, and the stager's copies (one rank, gloo). The collective save and load on real
ranks: tests/integration/test_sharded_checkpoints.py."""

from __future__ import annotations

import enum
import io
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from trainer.checkpoint import CheckpointError
from trainer.checkpoint.sharded import (
    ShardStager,
    check_metadata,
    check_targets,
    dcp_key,
    put_back,
    read_metadata,
    tensors_at,
)


def metadata(shape: list[int], file: str = "__0_0.distcp") -> Metadata:
    size = torch.Size(shape)
    md = TensorStorageMetadata(TensorProperties(dtype=torch.float32), size,
                               [ChunkStorageMetadata(torch.Size([0] * len(shape)), size)])
    index = MetadataIndex("model.w", torch.Size([0] * len(shape)), 0)
    return Metadata(state_dict_metadata={"model.w": md}, storage_data={index: _StorageInfo(file, 0, 128)})


MANIFEST: dict[str, Any] = {"files": {"__0_0.distcp": {}, ".metadata": {}, "unsharded.pt": {}},
                            "shards": {"model.w": {"shape": [4, 3], "dtype": "float32"}}}


def test_dcps_metadata_is_read_and_matches_its_manifest(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(pickle.dumps(metadata([4, 3])))
    read = read_metadata(tmp_path)
    assert list(read.state_dict_metadata) == ["model.w"]
    assert check_metadata(read, MANIFEST) == ""


def test_a_metadata_pickle_that_would_run_code_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError, match=r"\.metadata: unreadable: posix\.system is not part of"):
        read_metadata(tmp_path)
    assert not marker.exists()
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"not": "metadata"}))
    with pytest.raises(CheckpointError, match="not DCP's metadata"):
        read_metadata(tmp_path)


class _EnumsByName(pickle.Pickler):
    """Pickles an enum member as Python 3.11.0-3.11.4 do (Debian 12's python3): ``getattr(TheEnum,
    "NAME")``, whatever Python runs the test."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def by_name(obj: Any) -> bytes:
    out = io.BytesIO()
    _EnumsByName(out).dump(obj)
    return out.getvalue()


def test_metadata_pickled_by_python_3_11_2_is_read(tmp_path: Path) -> None:
    """CI on Debian's python3 (3.11.2) found sharded checkpoints unreadable: its pickle names an
    enum member through ``builtins.getattr``, which the metadata's unpickler refused."""
    md = metadata([4, 3])
    data = by_name(md)
    assert b"getattr" in data and b"_MEM_FORMAT_ENCODING" in data
    (tmp_path / ".metadata").write_bytes(data)
    read = read_metadata(tmp_path)
    entry, written = read.state_dict_metadata["model.w"], md.state_dict_metadata["model.w"]
    assert isinstance(entry, TensorStorageMetadata) and isinstance(written, TensorStorageMetadata)
    assert entry.properties == written.properties
    assert check_metadata(read, MANIFEST) == ""


@pytest.mark.parametrize("target", [torch.Size, TensorProperties, _MEM_FORMAT_ENCODING])
def test_getattr_in_a_metadata_pickle_reaches_only_the_metadatas_enum_members(tmp_path: Path, target: type) -> None:
    class Probe:
        def __reduce__(self) -> tuple[Any, ...]:
            return (getattr, (target, "__init__"))

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Probe()))
    with pytest.raises(CheckpointError, match=rf"unreadable: getattr\({target.__qualname__}, '__init__'\) is not part"):
        read_metadata(tmp_path)


@pytest.mark.parametrize(("md", "reason"), [
    (metadata([5, 3]), "model.w: .metadata says float32 [5, 3], the manifest float32 [4, 3]"),
    (metadata([4, 3], file="__9_0.distcp"), ".metadata points into '__9_0.distcp', which the manifest does not list"),
])
def test_metadata_that_differs_from_the_manifest_is_named(md: Metadata, reason: str) -> None:
    assert check_metadata(md, MANIFEST) == reason


def test_the_runs_tensors_must_have_the_checkpoints_shapes() -> None:
    assert check_targets(MANIFEST, {"model.w": torch.zeros(4, 3)}) == ""
    assert check_targets(MANIFEST, {"model.w": torch.zeros(4, 5)}) == (
        "model.w: the checkpoint's is float32 [4, 3], this run's float32 [4, 5] (a checkpoint of another model)")
    assert check_targets(MANIFEST, {}) == "model.w: in the checkpoint, not in this run (a checkpoint of another model)"
    assert check_targets(MANIFEST, {"model.w": torch.zeros(4, 3), "model.v": torch.zeros(1)}) == (
        "model.v: this run has it, the checkpoint does not (a checkpoint of another model)")


def test_loaded_tensors_go_back_to_their_places_beside_the_plain_state() -> None:
    target: dict[str, Any] = {"model": {"w": torch.zeros(2)},
                              "optimizer": {"state": {"w": {"exp_avg": torch.zeros(2)}}}}
    paths = [["model", "w"], ["optimizer", "state", "w", "exp_avg"]]
    found = tensors_at(target, paths)
    assert list(found) == ["model.w", "optimizer.state.w.exp_avg"] == [dcp_key(tuple(p)) for p in paths]
    rest = {"model": {}, "optimizer": {"state": {"w": {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]}}
    state = put_back(rest, paths, found)
    assert state["optimizer"]["state"]["w"]["exp_avg"] is target["optimizer"]["state"]["w"]["exp_avg"]
    assert state["optimizer"]["state"]["w"]["step"].item() == 3.0 and state["model"]["w"] is target["model"]["w"]


@pytest.fixture
def one_rank(tmp_path: Path) -> Any:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def staged(stager: ShardStager, shards: dict[str, DTensor]) -> dict[str, DTensor]:
    """What ``stager`` staged of ``shards``: a DTensor for each."""
    out = stager.stage(shards)
    assert all(isinstance(t, DTensor) for t in out.values()), out
    return {key: t for key, t in out.items() if isinstance(t, DTensor)}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_stager_copies_each_save_into_the_buffers_of_the_first(one_rank: None, device: str) -> None:
    """Staged shards hold the values of the save, not of the training that goes on after it; the
    second save reuses the first's buffers (pinned on a GPU) and holds the new values (on torch
    2.11 DCP's DefaultStager failed exactly there, at the second save). A 0-dim DTensor is
    copied too, not handed over."""
    mesh = init_device_mesh(device, (1,))
    weight = distribute_tensor(torch.arange(12.0).reshape(4, 3).to(device), mesh, [Shard(0)])
    scale = distribute_tensor(torch.tensor(5.0, device=device), mesh, [Replicate()])
    stager = ShardStager()

    first = staged(stager, {"w": weight, "s": scale})
    buffer = first["w"].to_local()
    assert buffer.device.type == "cpu" and buffer.is_pinned() == (device == "cuda")
    weight.to_local().add_(100.0)  # the optimizer steps on after the save
    scale.to_local().add_(1.0)
    assert torch.equal(first["w"].to_local(), torch.arange(12.0).reshape(4, 3))
    assert first["s"].to_local().item() == 5.0

    second = staged(stager, {"w": weight, "s": scale})
    assert second["w"].to_local().data_ptr() == buffer.data_ptr()
    assert torch.equal(second["w"].to_local(), torch.arange(12.0).reshape(4, 3) + 100.0)
    assert second["s"].to_local().item() == 6.0
    assert list(second) == ["w", "s"] and second["w"].placements == weight.placements
