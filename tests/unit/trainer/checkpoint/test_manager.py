"""The checkpoint manager (trainer/checkpoint/manager.py), what the training thread calls: a round
trip that restores model, optimizer, RNG and values, the snapshot a save takes, and asynchronous
saves. Real files in tmp_path, real torch, no mocks of the file system.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.trainer.checkpoint.training_states import assert_same, saved_at, training_state
from trainer import TrainerError
from trainer.checkpoint import CheckpointError, CheckpointManager, SaveResult, params_digest
from trainer.checkpoint import io as checkpoint_io

# -- round trip --------------------------------------------------------------------------


def test_round_trip_restores_model_optimizer_rng_and_values(tmp_path: Path) -> None:
    state = training_state()
    with_manager = CheckpointManager(tmp_path)
    with_manager.save(10, state, metrics={"loss": 0.5})
    result = with_manager.wait()
    assert result is not None and result.step == 10

    step, loaded = CheckpointManager(tmp_path, is_writer=False).load()

    assert step == 10
    assert_same(state, loaded)
    assert params_digest(loaded["model"]) == params_digest(state["model"]) == result.params_digest
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model.load_state_dict(loaded["model"])
    torch.optim.Adam(model.parameters()).load_state_dict(loaded["optimizer"])
    random.setstate(loaded["rng"]["python"])
    with_manager.close()


def test_params_digest_changes_with_one_ulp() -> None:
    model_state = training_state()["model"]
    nudged = {k: v.clone() for k, v in model_state.items()}
    w = nudged["0.weight"]
    w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(math.inf))
    assert params_digest(nudged) != params_digest(model_state)
    assert params_digest({k: v.clone() for k, v in model_state.items()}) == params_digest(model_state)
    renamed = {("x" + k): v for k, v in model_state.items()}
    assert params_digest(renamed) != params_digest(model_state)
    as_double = {k: v.double() for k, v in model_state.items()}
    assert params_digest(as_double) != params_digest(model_state)


def test_save_snapshots_so_later_training_does_not_leak_into_the_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    state = training_state()
    expected = {k: v.clone() for k, v in state["model"].items()}
    manager.save(1, state)
    for tensor in state["model"].values():  # the next optimizer step, while the writer runs
        tensor.add_(1.0)
    manager.wait()
    _, loaded = manager.load(1)
    assert_same(expected, dict(loaded["model"]))
    manager.close()


@pytest.mark.gpu
def test_deferred_cuda_snapshot_is_copied_beside_training_and_ordered_before_the_update(tmp_path: Path) -> None:
    """On CUDA the writer copies on a side stream: wait_snapshot() does not wait for the copy on
    the host, yet the update queued after it on the training stream cannot reach the copy (the
    device orders it), and the copy holds the state of the save() call, several times over."""
    manager = CheckpointManager(tmp_path)
    weights = torch.randn(64 * 2**20, device="cuda")  # 256 MB: the copy takes a while
    ready = manager.prepare({"model": {"w": weights}})  # the pinned buffer, ahead of the first save
    assert ready is not None
    ready.result()
    prepared = manager._stager._buffers[("model", "w")][1]
    assert prepared.is_pinned() and prepared.shape == weights.shape
    for step in range(1, 4):
        expected = weights.cpu()
        weights.mul_(1.0001)  # queued on the training stream before save(): the copy must see it
        expected.mul_(1.0001)
        manager.save(step, {"model": {"w": weights}}, defer_snapshot=True)
        manager.wait_snapshot()
        weights.add_(1.0)  # the next optimizer step, queued at once
        assert manager.wait() is not None
        _, loaded = manager.load(step)
        assert torch.equal(loaded["model"]["w"], expected)
        assert manager._stager._buffers[("model", "w")][1] is prepared  # copied into, not reallocated
    manager.close()


def test_deferred_snapshot_is_taken_by_the_writer_and_holds_the_state_of_the_save_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save(defer_snapshot=True) returns before copying; wait_snapshot() returns once the copy is
    private, so the optimizer step after it does not leak into the checkpoint."""
    release = threading.Event()
    real_snapshot = checkpoint_io._Stager.snapshot_beside
    copied_on: list[str] = []

    def slow_snapshot(self: Any, state: dict[str, Any], ready: dict) -> tuple[dict[str, Any], dict]:
        copied_on.append(threading.current_thread().name)
        assert release.wait(30), "test never released the snapshot"
        return real_snapshot(self, state, ready)

    monkeypatch.setattr(checkpoint_io._Stager, "snapshot_beside", slow_snapshot)
    manager = CheckpointManager(tmp_path)
    state = training_state()
    expected = {k: v.clone() for k, v in state["model"].items()}
    manager.save(1, state, defer_snapshot=True)  # returns although the snapshot is held
    entered = threading.Event()

    def wait_snapshot() -> None:
        entered.set()
        manager.wait_snapshot()

    waiter = threading.Thread(target=wait_snapshot)
    waiter.start()
    # Released only once the waiter is in wait_snapshot(): a thread started but not yet run (a loaded
    # machine, CI 3 of 2026-12-02) came in after the release and was blocked for 35 us, not 0.2 s.
    assert entered.wait(30)
    time.sleep(0.2)
    assert waiter.is_alive(), "wait_snapshot() returned before the snapshot was taken"
    release.set()
    waiter.join(30)
    assert not waiter.is_alive()
    for tensor in state["model"].values():  # the next optimizer step
        tensor.add_(1.0)
    result = manager.wait()
    assert copied_on and copied_on[0].startswith("runyard-ckpt-writer")
    assert result is not None and result.blocked_s >= 0.15  # the wait counts as training blocked
    assert result.params_digest == params_digest(expected)
    _, loaded = manager.load(1)
    assert_same(expected, dict(loaded["model"]))
    assert manager.wait_snapshot() == 0.0  # nothing pending
    manager.close()


def test_deferred_snapshot_failure_is_raised_by_wait_snapshot(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"model": {}, "extra": {"when": object()}}, defer_snapshot=True)
    with pytest.raises(CheckpointError, match=r"snapshot of checkpoint step 1 failed: .*unsupported type object"):
        manager.wait_snapshot()
    with pytest.raises(CheckpointError):  # and the save is not reported as done
        manager.wait()
    assert manager.verified_steps() == []
    manager.close()


def test_snapshot_handles_odd_tensors_and_reused_buffers_take_new_values(tmp_path: Path) -> None:
    base = torch.randn(6, 5)
    model: dict[str, torch.Tensor] = {
        "big": torch.randn(3 << 20),  # 12 MB: copied in several chunks
        "transposed": base.t(),
        "slice": base[2:4],
        "bf16": torch.randn(7, dtype=torch.bfloat16),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(3),
        "mask": torch.tensor([True, False]),
    }
    state = {"model": model, "rng": torch.get_rng_state()}
    manager = CheckpointManager(tmp_path)
    expected = []
    for step in (1, 2):
        expected.append({k: v.clone() for k, v in model.items()})
        manager.save(step, state)
        manager.wait()
        for tensor in model.values():
            if tensor.dtype != torch.bool and tensor.numel():
                tensor.mul_(2).add_(1)
    for step, saved in zip((1, 2), expected, strict=True):
        _, loaded = manager.load(step)
        assert_same(saved, loaded["model"])
        assert loaded["model"]["transposed"].stride() == base.t().stride()
    manager.close()


def test_tied_weights_stay_tied(tmp_path: Path) -> None:
    shared = torch.randn(4, 4)
    manager = CheckpointManager(tmp_path, async_save=False)
    manager.save(1, {"model": {"embed": shared, "head": shared}})
    _, loaded = manager.load(1)
    assert loaded["model"]["embed"].data_ptr() == loaded["model"]["head"].data_ptr()


def test_unsupported_value_is_rejected_on_the_calling_thread_naming_its_key(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    with pytest.raises(CheckpointError, match=r"state\['extra'\]\['when'\]: unsupported type object"):
        manager.save(1, {"model": {}, "extra": {"when": object()}})
    with pytest.raises(CheckpointError, match="params_key"):
        manager.save(1, {"weights": {}})
    with pytest.raises(CheckpointError, match=r"metrics\['loss'\]"):
        manager.save(1, {"model": {}}, metrics={"loss": "low"})  # type: ignore[dict-item]
    assert issubclass(CheckpointError, TrainerError)
    assert not list(tmp_path.iterdir())


# -- asynchronous save ------------------------------------------------------------------


def test_async_save_returns_before_the_write_and_wait_reports_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    writing = threading.Event()
    real_write_all = checkpoint_io._HashingFile._write_all

    def slow_write_all(self: Any, view: memoryview) -> None:
        writing.set()
        assert release.wait(30), "test never released the writer"
        real_write_all(self, view)

    monkeypatch.setattr(checkpoint_io._HashingFile, "_write_all", slow_write_all)
    completed: list[SaveResult] = []
    manager = CheckpointManager(tmp_path, on_complete=completed.append)
    state = training_state()

    started = time.perf_counter()
    manager.save(3, state, metrics={"loss": 0.25})
    returned_after = time.perf_counter() - started

    assert writing.wait(30)
    assert not (tmp_path / "step-3").exists() and manager.verified_steps() == []
    time.sleep(0.2)
    release.set()
    result = manager.wait()

    assert result is not None and completed == [result]
    assert result.step == 3 and result.path == tmp_path / "step-3"
    files = [p for p in result.path.iterdir()]
    assert sorted(p.name for p in files) == ["manifest.json", "state.pt"]
    assert result.bytes == sum(p.stat().st_size for p in files)
    manifest_bytes = (result.path / "manifest.json").read_bytes()
    assert result.manifest_sha256 == hashlib.sha256(manifest_bytes).hexdigest()
    manifest = json.loads(manifest_bytes)
    state_bytes = (result.path / "state.pt").read_bytes()
    assert manifest["files"]["state.pt"] == {
        "bytes": len(state_bytes),
        "sha256": hashlib.sha256(state_bytes).hexdigest(),
    }
    assert manifest["step"] == 3 and manifest["metrics"] == {"loss": 0.25} == result.metrics
    assert result.params_digest == manifest["params_digest"] == params_digest(state["model"])
    assert result.blocked_s <= returned_after
    assert result.total_s >= result.blocked_s + 0.2
    assert manager.wait() is None
    assert manager.verified_steps() == [3]
    manager.close()


def test_sync_save_is_durable_when_save_returns(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, async_save=False)
    manager.save(1, training_state())
    assert manager.verified_steps() == [1]
    result = manager.wait()
    assert result is not None and result.blocked_s == pytest.approx(result.total_s, rel=0.5)


@pytest.mark.parametrize("async_save", [True, False])
def test_on_complete_that_calls_back_into_the_manager_is_refused_not_deadlocked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, async_save: bool
) -> None:
    manager: CheckpointManager

    def on_complete(result: SaveResult) -> None:
        manager.save(result.step + 1, training_state())

    manager = CheckpointManager(tmp_path, async_save=async_save, on_complete=on_complete)
    manager.save(1, training_state())
    result = manager.wait()
    assert result is not None and manager.verified_steps() == [1]
    assert "on_complete failed" in caplog.text and "would deadlock" in caplog.text
    manager.close()


def test_non_writer_save_and_delete_do_nothing(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    manager = CheckpointManager(root, is_writer=False)
    manager.save(1, training_state())
    assert manager.wait() is None
    manager.delete(1)
    assert not root.exists() and manager.verified_steps() == []
    manager.close()


def test_saving_an_existing_step_replaces_it(tmp_path: Path) -> None:
    manager = saved_at(tmp_path, 1)
    manager.save(1, training_state(seed=99))
    manager.wait()
    _, loaded = manager.load(1)
    assert_same(training_state(seed=99)["model"], loaded["model"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]


def test_delete_removes_the_step(tmp_path: Path) -> None:
    manager = saved_at(tmp_path, 1, 2)
    manager.delete(1)
    manager.delete(5)  # absent: nothing to do
    assert manager.verified_steps() == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2"]
