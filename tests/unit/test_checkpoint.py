"""Checkpoint manager through PyTorch Distributed Checkpoint: real files in tmp_path, real torch,
one process (DCP saves and loads without a process group then; the 4-rank and resharding cases
run under torchrun in tests/integration/test_gpt_char.py)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    CheckpointInfo,
    CheckpointManager,
    SaveResult,
    select_kept,
)
from trainer.checkpoint.checkpointer import restore_sharded, sharded_state
from trainer.checkpoint.io import read_metadata

SHARD = "__0_0.distcp"


def _trained(seed: int = 0, width: int = 16) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 8)).pow(2).mean().backward()
    optimizer.step()
    return {"model": model, "optimizer": optimizer, "data": {"epoch": 2, "position": 40}}


def _save(manager: CheckpointManager, step: int, objects: dict[str, Any], **kwargs: Any) -> SaveResult:
    tensors, plain = sharded_state(objects)
    manager.save(step, tensors, extra={"state": plain, "step": step}, metrics={"loss": 1.0 / (step + 1)},
                 **kwargs)
    manager.wait_snapshot()
    result = manager.wait()
    assert result is not None
    return result


def _load(root: Path, objects: dict[str, Any], step: int = -1,
          refused: list[tuple[int, str]] | None = None) -> tuple[int, dict[str, Any]]:
    tensors, _ = sharded_state(objects)
    manager = CheckpointManager(root, is_writer=False, on_refused=lambda s, r: (refused if refused is not None else [])
                                .append((s, r)))
    loaded, extra = manager.load(tensors, step)
    restore_sharded(objects, tensors)
    return loaded, extra


def _saved(root: Path, *steps: int) -> CheckpointManager:
    manager = CheckpointManager(root, async_save=False)
    for step in steps:
        _save(manager, step, _trained(step))
    return manager


@pytest.mark.parametrize(("async_save", "defer"), [(False, False), (True, False), (True, True)])
def test_round_trip_restores_model_optimizer_and_plain_values(tmp_path: Path, async_save: bool, defer: bool) -> None:
    saved = _trained(1)
    result = _save(CheckpointManager(tmp_path, async_save=async_save), 7, saved, defer_snapshot=defer)
    assert result.path == tmp_path / "step-7" and result.metrics == {"loss": 0.125}
    assert sorted(os.listdir(result.path)) == [".metadata", SHARD, "extra.pt", "manifest.json"]

    fresh = _trained(2)
    step, extra = _load(tmp_path, fresh)
    assert step == 7 and extra["state"] == {"data": {"epoch": 2, "position": 40}}
    for a, b in zip(saved["model"].state_dict().values(), fresh["model"].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    a_opt, b_opt = saved["optimizer"].state_dict(), fresh["optimizer"].state_dict()
    for key in a_opt["state"]:
        assert torch.equal(a_opt["state"][key]["exp_avg_sq"], b_opt["state"][key]["exp_avg_sq"])
    assert a_opt["param_groups"] == b_opt["param_groups"]


def test_manifest_lists_every_file_with_size_and_sha256_and_is_written_last(tmp_path: Path) -> None:
    result = _save(CheckpointManager(tmp_path, async_save=False), 3, _trained())
    data = (result.path / "manifest.json").read_bytes()
    manifest = json.loads(data)
    assert result.manifest_sha256 == hashlib.sha256(data).hexdigest()
    assert manifest["format_version"] == FORMAT_VERSION and manifest["step"] == 3 and manifest["world_size"] == 1
    assert set(manifest["files"]) == {".metadata", SHARD, "extra.pt"}
    for name, entry in manifest["files"].items():
        body = (result.path / name).read_bytes()
        assert entry == {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    newest = max((result.path / n).stat().st_mtime_ns for n in manifest["files"])
    assert (result.path / "manifest.json").stat().st_mtime_ns >= newest
    assert manifest["params_digest"] == result.params_digest and len(result.params_digest) == 64


def test_params_digest_follows_the_weights(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, async_save=False)
    a = _save(manager, 1, _trained(5)).params_digest
    b = _save(manager, 2, _trained(5)).params_digest
    nudged = _trained(5)
    with torch.no_grad():
        first = next(nudged["model"].parameters())
        first.view(-1)[0] = torch.nextafter(first.view(-1)[0], torch.tensor(math.inf))
    c = _save(manager, 3, nudged).params_digest
    assert a == b != c


def test_async_save_stages_so_later_training_does_not_leak_in(tmp_path: Path) -> None:
    objects = _trained()
    expected = {k: v.clone() for k, v in objects["model"].state_dict().items()}
    manager = CheckpointManager(tmp_path)
    tensors, plain = sharded_state(objects)
    manager.save(1, tensors, extra={"state": plain}, defer_snapshot=True)
    manager.wait_snapshot()  # what the loop does before optimizer.step()
    with torch.no_grad():
        for p in objects["model"].parameters():
            p.add_(1.0)
    manager.wait()
    fresh = _trained(9)
    _load(tmp_path, fresh)
    for key, value in fresh["model"].state_dict().items():
        assert torch.equal(value, expected[key]), key


def test_bad_arguments_are_refused_naming_them(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    with pytest.raises(CheckpointError, match="step=-1"):
        manager.save(-1, {"model": {}})
    with pytest.raises(CheckpointError, match=r"state\['model'\]"):
        manager.save(1, {"optimizer": {}})
    with pytest.raises(CheckpointError, match=r"metrics\['loss'\]='x'"):
        manager.save(1, {"model": {}}, metrics={"loss": "x"})  # type: ignore[dict-item]
    with pytest.raises(CheckpointError, match=r"state\['optimizer'\] is an optimizer but state has no 'model'"):
        sharded_state({"optimizer": _trained()["optimizer"]})


@pytest.mark.parametrize("async_save", [True, False])
def test_on_complete_that_calls_back_into_the_manager_is_refused_not_deadlocked(
        tmp_path: Path, async_save: bool) -> None:
    errors: list[BaseException] = []

    def on_complete(result: SaveResult) -> None:
        try:
            manager.wait()
        except CheckpointError as exc:
            errors.append(exc)

    manager = CheckpointManager(tmp_path, async_save=async_save, on_complete=on_complete)
    _save(manager, 1, _trained())
    assert len(errors) == 1 and "on_complete" in str(errors[0])


def test_saving_an_existing_step_replaces_it_and_delete_removes_it(tmp_path: Path) -> None:
    manager = _saved(tmp_path, 1)
    again = _save(manager, 1, _trained(4))
    assert json.loads((again.path / "manifest.json").read_text())["params_digest"] == again.params_digest
    assert manager.verified_steps() == [1]
    manager.delete(1)
    assert manager.stored_steps() == [] and os.listdir(tmp_path) == []


def test_writer_init_removes_leftover_tmp_and_deleting_dirs(tmp_path: Path) -> None:
    _saved(tmp_path, 1)
    for name in (".tmp-step-2-abcd", ".deleting-step-0-ef01"):
        (tmp_path / name).mkdir()
        (tmp_path / name / SHARD).write_bytes(b"partial")
    assert CheckpointManager(tmp_path, is_writer=False).stored_steps() == [1]  # a reader leaves them
    assert len(os.listdir(tmp_path)) == 3
    CheckpointManager(tmp_path)
    assert os.listdir(tmp_path) == ["step-1"]


def _flip(step_dir: Path) -> str:
    path = step_dir / SHARD
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return f"{SHARD}: sha256 mismatch"


def _truncate(step_dir: Path) -> str:
    path = step_dir / SHARD
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-100])
    return f"{SHARD}: size {size - 100} != {size}"


def _delete_shard(step_dir: Path) -> str:
    (step_dir / SHARD).unlink()
    return f"{SHARD}: missing"


def _delete_manifest(step_dir: Path) -> str:
    (step_dir / "manifest.json").unlink()
    return "manifest missing"


def _unlist_shard(step_dir: Path) -> str:
    """A manifest that disagrees with DCP's .metadata: the shard dropped from both the folder and
    the manifest (as a partial copy would), which .metadata still names."""
    manifest = json.loads((step_dir / "manifest.json").read_text())
    del manifest["files"][SHARD]
    (step_dir / SHARD).unlink()
    (step_dir / "manifest.json").write_text(json.dumps(manifest))
    return f".metadata: names '{SHARD}'"


def _stray_file(step_dir: Path) -> str:
    (step_dir / "__1_0.distcp").write_bytes(b"x")
    return "__1_0.distcp: unlisted file"


@pytest.mark.parametrize("damage", [_flip, _truncate, _delete_shard, _delete_manifest, _unlist_shard, _stray_file])
def test_damaged_checkpoint_is_refused_by_name_and_load_falls_back(tmp_path: Path, damage: Any) -> None:
    _saved(tmp_path, 1, 2)
    reason = damage(tmp_path / "step-2")
    refused: list[tuple[int, str]] = []
    objects = _trained(9)
    step, _ = _load(tmp_path, objects, refused=refused)
    assert step == 1
    assert [s for s, _ in refused] == [2] and refused[0][1].startswith(reason), refused
    reference = _trained(1)["model"].state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in objects["model"].state_dict().items())


def test_checkpoint_of_other_shapes_is_refused_before_loading(tmp_path: Path) -> None:
    _saved(tmp_path, 1)
    refused: list[tuple[int, str]] = []
    wider = _trained(0, width=32)
    with pytest.raises(CheckpointError, match="no verified checkpoint"):
        _load(tmp_path, wider, refused=refused)
    assert refused == [(1, "model.0.weight: shape [16, 8] in the checkpoint != [32, 8] here")]


def test_a_key_the_checkpoint_lacks_keeps_its_fresh_state(tmp_path: Path) -> None:
    _saved(tmp_path, 1)
    objects = _trained(3)
    objects["scaler"] = torch.nn.Linear(2, 2)  # a module the checkpoint has nothing of
    objects["model"], objects["optimizer"] = objects["model"], objects["optimizer"]
    before = objects["scaler"].weight.clone()
    assert _load(tmp_path, objects)[0] == 1
    assert torch.equal(objects["scaler"].weight, before)


def test_load_of_a_missing_step_falls_back_and_nothing_verified_raises(tmp_path: Path) -> None:
    _saved(tmp_path, 1)
    refused: list[tuple[int, str]] = []
    assert _load(tmp_path, _trained(), step=5, refused=refused)[0] == 1
    assert refused == [(5, "missing")]
    with pytest.raises(CheckpointError, match="no verified checkpoint"):
        _load(tmp_path / "empty", _trained())


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path(self.marker).touch, ())


def _forge_manifest(step_dir: Path, name: str) -> None:
    manifest = json.loads((step_dir / "manifest.json").read_text())
    data = (step_dir / name).read_bytes()
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("target", [".metadata", "extra.pt"])
def test_a_pickle_that_would_run_code_is_refused_even_with_a_matching_manifest(tmp_path: Path, target: str) -> None:
    """Someone rewrote a file with a pickle that runs code, and the manifest to match: the
    restricted .metadata unpickler and weights_only=True refuse it, nothing runs, the older
    checkpoint is loaded."""
    _saved(tmp_path, 1, 2)
    step_dir = tmp_path / "step-2"
    marker = tmp_path / "pwned"
    if target == ".metadata":
        metadata = read_metadata(step_dir / ".metadata")
        metadata.planner_data = _Payload(str(marker))
        (step_dir / ".metadata").write_bytes(pickle.dumps(metadata))
    else:
        (step_dir / "extra.pt").write_bytes(pickle.dumps({"x": _Payload(str(marker))}))
    _forge_manifest(step_dir, target)
    refused: list[tuple[int, str]] = []
    assert _load(tmp_path, _trained(), refused=refused)[0] == 1
    assert not marker.exists()
    assert [s for s, _ in refused] == [2] and refused[0][1].startswith(target), refused
    assert "is not allowed in a checkpoint's .metadata" in refused[0][1] or "weights_only=True" in refused[0][1]


@pytest.mark.gpu
def test_cuda_state_is_staged_into_pinned_memory_beside_training(tmp_path: Path) -> None:
    """On a GPU (skipped without one): DCP's stager copies CUDA tensors on a side stream into
    pinned CPU memory; after wait_snapshot the training may change them, the checkpoint keeps the
    values of the save call."""
    objects = _trained()
    objects["model"].cuda()
    objects["optimizer"] = torch.optim.AdamW(objects["model"].parameters())
    expected = {k: v.cpu().clone() for k, v in objects["model"].state_dict().items()}
    manager = CheckpointManager(tmp_path)
    tensors, plain = sharded_state(objects)
    manager.save(1, tensors, extra={"state": plain}, defer_snapshot=True)
    manager.wait_snapshot()
    with torch.no_grad():
        for p in objects["model"].parameters():
            p.add_(1.0)
    manager.close()
    fresh = _trained(9)
    _load(tmp_path, fresh)
    for key, value in fresh["model"].state_dict().items():
        assert torch.equal(value, expected[key]), key


# -- retention --------------------------------------------------------------------------


def _expected_kept(infos: list[CheckpointInfo], keep_last: int, keep_best: int, mode: str) -> set[int]:
    """An independent oracle: count, for each checkpoint, how many beat it."""
    verified = [c for c in infos if c.verified]
    scored = [c for c in verified if c.metric is not None and not math.isnan(c.metric)]

    def beats(d: CheckpointInfo, c: CheckpointInfo) -> bool:
        better = d.metric < c.metric if mode == "min" else d.metric > c.metric  # type: ignore[operator]
        return better or (d.metric == c.metric and d.step > c.step)

    last = {c.step for c in verified if sum(d.step > c.step for d in verified) < keep_last}
    best = {c.step for c in scored if sum(beats(d, c) for d in scored) < keep_best}
    kept = last | best | {c.step for c in infos if c.pinned}
    if verified and not kept & {c.step for c in verified}:
        kept.add(max(c.step for c in verified))
    return kept


_metrics = st.one_of(st.none(), st.just(math.nan), st.sampled_from([0.0, 1.0, 2.0]), st.floats(-10, 10))


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.booleans(), st.booleans(), _metrics), max_size=12
    ).flatmap(
        lambda rows: st.tuples(
            st.just(rows), st.lists(st.integers(0, 10_000), min_size=len(rows), max_size=len(rows), unique=True)
        )
    ),
    keep_last=st.integers(0, 5),
    keep_best=st.integers(0, 5),
    mode=st.sampled_from(["min", "max"]),
)
def test_select_kept_matches_last_best_and_pinned(
    data: tuple[list[tuple[bool, bool, float | None]], list[int]], keep_last: int, keep_best: int, mode: str
) -> None:
    rows, steps = data
    infos = [CheckpointInfo(s, verified=v, pinned=p, metric=m) for s, (v, p, m) in zip(steps, rows, strict=True)]
    kept = select_kept(infos, keep_last, keep_best, mode)  # type: ignore[arg-type]
    assert kept == _expected_kept(infos, keep_last, keep_best, mode)
    if any(c.verified for c in infos):
        assert kept & {c.step for c in infos if c.verified}


def test_select_kept_examples() -> None:
    infos = [
        CheckpointInfo(100, True, metric=0.9),
        CheckpointInfo(200, True, metric=0.5),
        CheckpointInfo(300, True, metric=math.nan),
        CheckpointInfo(400, False, metric=0.1),  # unverified: never best, never last
        CheckpointInfo(500, True, metric=None),
        CheckpointInfo(600, False, pinned=True),
        CheckpointInfo(50, True, pinned=True, metric=2.0),
    ]
    assert select_kept(infos, keep_last=2, keep_best=1) == {500, 300, 200, 600, 50}
    assert select_kept(infos, keep_last=0, keep_best=2, best_mode="max") == {50, 100, 600}
    assert select_kept(infos, keep_last=0, keep_best=0) == {600, 50}
    nan_only = [CheckpointInfo(1, True, metric=math.nan), CheckpointInfo(2, True, metric=math.nan)]
    assert select_kept(nan_only, keep_last=0, keep_best=3) == {2}  # NaN is never best; newest kept
    assert select_kept([CheckpointInfo(1, False), CheckpointInfo(2, False)], 3, 3) == set()
    assert select_kept([], 3, 3) == set()
    with pytest.raises(CheckpointError, match="keep_last=-1"):
        select_kept(infos, keep_last=-1, keep_best=0)
