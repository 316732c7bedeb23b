"""Checkpoint manager: real files in tmp_path, real torch, no mocks of the file system."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.paths import ROOT
from trainer import TrainerError
from trainer.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    CheckpointInfo,
    CheckpointManager,
    SaveResult,
    params_digest,
    select_kept,
)
from trainer.checkpoint import io as checkpoint_io


def _training_state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    random.seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 8)).pow(2).mean().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        "step": 7,
        "epoch": 2,
        "extra": {"name": "mlp", "blob": b"\x00\x01", "none": None, "pair": (1, 2.5), "lr": [1e-3]},
    }


def _assert_same(a: Any, b: Any, where: str = "state") -> None:
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _saved(root: Path, *steps: int, **kwargs: Any) -> CheckpointManager:
    manager = CheckpointManager(root, **kwargs)
    for step in steps:
        manager.save(step, _training_state(step), metrics={"loss": 1.0 / (step + 1)})
        manager.wait()
    return manager


# -- round trip --------------------------------------------------------------------------


def test_round_trip_restores_model_optimizer_rng_and_values(tmp_path: Path) -> None:
    state = _training_state()
    with_manager = CheckpointManager(tmp_path)
    with_manager.save(10, state, metrics={"loss": 0.5})
    result = with_manager.wait()
    assert result is not None and result.step == 10

    step, loaded = CheckpointManager(tmp_path, is_writer=False).load()

    assert step == 10
    _assert_same(state, loaded)
    assert params_digest(loaded["model"]) == params_digest(state["model"]) == result.params_digest
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model.load_state_dict(loaded["model"])
    torch.optim.Adam(model.parameters()).load_state_dict(loaded["optimizer"])
    random.setstate(loaded["rng"]["python"])
    with_manager.close()


def test_params_digest_changes_with_one_ulp() -> None:
    model_state = _training_state()["model"]
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
    state = _training_state()
    expected = {k: v.clone() for k, v in state["model"].items()}
    manager.save(1, state)
    for tensor in state["model"].values():  # the next optimizer step, while the writer runs
        tensor.add_(1.0)
    manager.wait()
    _, loaded = manager.load(1)
    _assert_same(expected, dict(loaded["model"]))
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
    state = _training_state()
    expected = {k: v.clone() for k, v in state["model"].items()}
    manager.save(1, state, defer_snapshot=True)  # returns although the snapshot is held
    waiter = threading.Thread(target=manager.wait_snapshot)
    waiter.start()
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
    _assert_same(expected, dict(loaded["model"]))
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
        _assert_same(saved, loaded["model"])
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
    state = _training_state()

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
    manager.save(1, _training_state())
    assert manager.verified_steps() == [1]
    result = manager.wait()
    assert result is not None and result.blocked_s == pytest.approx(result.total_s, rel=0.5)


@pytest.mark.parametrize("async_save", [True, False])
def test_on_complete_that_calls_back_into_the_manager_is_refused_not_deadlocked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, async_save: bool
) -> None:
    manager: CheckpointManager

    def on_complete(result: SaveResult) -> None:
        manager.save(result.step + 1, _training_state())

    manager = CheckpointManager(tmp_path, async_save=async_save, on_complete=on_complete)
    manager.save(1, _training_state())
    result = manager.wait()
    assert result is not None and manager.verified_steps() == [1]
    assert "on_complete failed" in caplog.text and "would deadlock" in caplog.text
    manager.close()


def test_non_writer_save_and_delete_do_nothing(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    manager = CheckpointManager(root, is_writer=False)
    manager.save(1, _training_state())
    assert manager.wait() is None
    manager.delete(1)
    assert not root.exists() and manager.verified_steps() == []
    manager.close()


def test_saving_an_existing_step_replaces_it(tmp_path: Path) -> None:
    manager = _saved(tmp_path, 1)
    manager.save(1, _training_state(seed=99))
    manager.wait()
    _, loaded = manager.load(1)
    _assert_same(_training_state(seed=99)["model"], loaded["model"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]


def test_delete_removes_the_step(tmp_path: Path) -> None:
    manager = _saved(tmp_path, 1, 2)
    manager.delete(1)
    manager.delete(5)  # absent: nothing to do
    assert manager.verified_steps() == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2"]


# -- atomicity --------------------------------------------------------------------------


def test_writer_failing_midway_leaves_no_step_and_surfaces_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = _saved(tmp_path, 1)
    real_write_all = checkpoint_io._HashingFile._write_all

    def failing_write_all(self: Any, view: memoryview) -> None:
        if self.bytes > 1000:
            raise OSError(28, "No space left on device")
        real_write_all(self, view)

    monkeypatch.setattr(checkpoint_io._HashingFile, "_write_all", failing_write_all)
    manager.save(2, {"model": {"w": torch.randn(512, 1024)}, "opt": {"m": torch.randn(512, 1024)}})
    with pytest.raises(CheckpointError, match=r"step 2.*No space left") as info:
        manager.wait()
    assert isinstance(info.value.__cause__, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]
    assert manager.verified_steps() == [1]

    monkeypatch.setattr(checkpoint_io._HashingFile, "_write_all", real_write_all)
    manager.save(3, _training_state())  # the manager still works after a failed write
    assert manager.wait() is not None and manager.verified_steps() == [1, 3]


def test_previous_async_failure_is_raised_by_the_next_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = CheckpointManager(tmp_path)
    monkeypatch.setattr(checkpoint_io._HashingFile, "_write_all", lambda self, view: 1 / 0)
    manager.save(1, _training_state())
    with pytest.raises(CheckpointError, match="step 1"):
        manager.save(2, _training_state())
    assert manager.wait() is None


_KILLED_WRITER = """
import sys, time, torch
from pathlib import Path
from trainer import checkpoint
from trainer.checkpoint import io as checkpoint_io
real = checkpoint_io._HashingFile._write_all
def stalled(self, view):
    real(self, view)
    if self.bytes > (4 << 20):
        print("writing", flush=True)
        time.sleep(600)
checkpoint_io._HashingFile._write_all = stalled
manager = checkpoint.CheckpointManager(Path(sys.argv[1]))
manager.save(2, {"model": {f"w{i}": torch.randn(1 << 20) for i in range(8)}})
manager.wait()
"""


def test_writer_killed_mid_write_leaves_no_step(tmp_path: Path) -> None:
    _saved(tmp_path, 1).close()
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "writing"
        partial = list(tmp_path.glob(".tmp-step-2-*/state.pt"))
        assert len(partial) == 1 and partial[0].stat().st_size > (4 << 20)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stdout.close()  # type: ignore[union-attr]

    reader = CheckpointManager(tmp_path, is_writer=False)
    assert reader.verified_steps() == [1] and reader.load()[0] == 1
    assert not (tmp_path / "step-2").exists()
    assert len(list(tmp_path.glob(".tmp-*"))) == 1  # readers ignore it, leave it alone

    CheckpointManager(tmp_path)  # a writer cleans it up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]


def test_writer_init_removes_leftover_tmp_and_deleting_dirs(tmp_path: Path) -> None:
    for name in (".tmp-step-5-abcd", ".deleting-step-3-ef01"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.pt").write_bytes(b"partial")
    CheckpointManager(tmp_path)
    assert list(tmp_path.iterdir()) == []


# -- corruption -------------------------------------------------------------------------


def _truncate(step_dir: Path) -> str:
    path = step_dir / "state.pt"
    size = path.stat().st_size
    os.truncate(path, size - 100)
    return f"state.pt: size {size - 100} != {size}"


def _flip_byte(step_dir: Path) -> str:
    path = step_dir / "state.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return "state.pt: sha256 mismatch"


def _delete_manifest(step_dir: Path) -> str:
    (step_dir / "manifest.json").unlink()
    return "manifest missing"


def _add_file(step_dir: Path) -> str:
    (step_dir / "notes.txt").write_text("hello")
    return "notes.txt: unlisted file"


def _edit_manifest_step(step_dir: Path) -> str:
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["step"] = 7
    (step_dir / "manifest.json").write_text(json.dumps(manifest))
    return "manifest step 7 != 2"


def _replace_with_file(step_dir: Path) -> str:
    for child in step_dir.iterdir():
        child.unlink()
    step_dir.rmdir()
    step_dir.write_bytes(b"not a checkpoint")
    return "not a directory"


@pytest.mark.parametrize(
    "corrupt", [_truncate, _flip_byte, _delete_manifest, _add_file, _edit_manifest_step, _replace_with_file]
)
def test_corrupt_checkpoint_is_refused_and_load_falls_back(tmp_path: Path, corrupt: Any) -> None:
    _saved(tmp_path, 1, 2).close()
    reason = corrupt(tmp_path / "step-2")
    refused: list[tuple[int, str]] = []
    manager = CheckpointManager(tmp_path, on_refused=lambda step, why: refused.append((step, why)))

    assert manager.verify(2) == (False, reason)
    assert manager.verify(1) == (True, "ok")
    assert manager.verified_steps() == [1]

    step, loaded = manager.load(-1)
    assert step == 1 and refused == [(2, reason)]
    _assert_same(_training_state(1)["model"], loaded["model"])

    refused.clear()
    assert manager.load(2)[0] == 1 and refused == [(2, reason)]


def test_load_of_a_missing_step_falls_back_and_nothing_verified_raises(tmp_path: Path) -> None:
    refused: list[tuple[int, str]] = []
    manager = _saved(tmp_path, 1, 3, on_refused=lambda step, why: refused.append((step, why)))
    assert manager.load(2)[0] == 1 and refused == [(2, "missing")]
    with pytest.raises(CheckpointError, match="no verified checkpoint at or below step 0"):
        manager.load(0)
    _flip_byte(tmp_path / "step-1")
    refused.clear()
    with pytest.raises(CheckpointError, match="no verified checkpoint at or below step 2"):
        manager.load(2)
    assert refused == [(2, "missing"), (1, "state.pt: sha256 mismatch")]
    with pytest.raises(CheckpointError, match="no verified checkpoint in"):
        CheckpointManager(tmp_path / "empty", is_writer=False).load()


class _Payload:
    """Unpickling this runs a shell command: what weights_only must refuse."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch '{self.marker}'",))


def test_malicious_pickle_with_a_matching_manifest_is_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    step_dir = tmp_path / "ckpt" / "step-4"
    step_dir.mkdir(parents=True)
    torch.save({"model": {"w": torch.zeros(2)}, "payload": _Payload(marker)}, step_dir / "state.pt")
    data = (step_dir / "state.pt").read_bytes()
    manifest = {
        "format_version": FORMAT_VERSION,
        "step": 4,
        "created_at": "2025-01-01T00:00:00+00:00",
        "files": {"state.pt": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
        "params_digest": "",
        "metrics": {},
    }
    (step_dir / "manifest.json").write_text(json.dumps(manifest))
    refused: list[tuple[int, str]] = []
    manager = CheckpointManager(tmp_path / "ckpt", is_writer=False, on_refused=lambda s, r: refused.append((s, r)))
    assert manager.verify(4) == (True, "ok")

    # Refused like a checkpoint that fails verification: with nothing older, nothing to load.
    with pytest.raises(CheckpointError, match="no verified checkpoint at or below step 4"):
        manager.load(4)
    with pytest.raises(CheckpointError, match="no verified checkpoint"):
        manager.load(-1)
    assert [s for s, _ in refused] == [4, 4]
    assert "weights_only" in refused[0][1] and "posix.system" in refused[0][1]
    assert not marker.exists()

    torch.load(step_dir / "state.pt", weights_only=False)  # the payload is live: it would run
    assert marker.exists()


@dataclasses.dataclass
class _NotAllowed:
    """A harmless class that weights_only's allow-list does not have."""

    value: int


def _forge(step_dir: Path, data: bytes) -> None:
    """Write ``data`` as state.pt and rewrite the manifest so that it matches (sizes and hash):
    the checkpoint verifies, whatever is in it."""
    (step_dir / "state.pt").write_bytes(data)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"]["state.pt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("forgery", ["truncated", "refused-type"])
def test_checkpoint_that_verifies_but_cannot_be_loaded_is_refused_and_the_older_one_used(
    tmp_path: Path, forgery: str
) -> None:
    _saved(tmp_path, 10, 20)
    step_dir = tmp_path / "step-20"
    if forgery == "truncated":
        data = (step_dir / "state.pt").read_bytes()[:1000]
    else:  # a type outside weights_only's allow-list (what a torch upgrade can also produce)
        buf = io.BytesIO()
        torch.save({"model": {"w": torch.zeros(2)}, "extra": _NotAllowed(1)}, buf)
        data = buf.getvalue()
    _forge(step_dir, data)
    refused: list[tuple[int, str]] = []
    reader = CheckpointManager(tmp_path, is_writer=False, on_refused=lambda s, r: refused.append((s, r)))
    assert reader.verify(20) == (True, "ok")  # the manifest matches: only loading tells

    step, state = reader.load(20)

    assert step == 10 and "model" in state
    assert [s for s, _ in refused] == [20]
    assert "cannot be loaded with weights_only=True" in refused[0][1]
    if forgery == "refused-type":
        assert "_NotAllowed" in refused[0][1]
    assert reader.load(-1)[0] == 10


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
