"""Verifying and loading a checkpoint (trainer/checkpoint/loading.py): a corrupt one is refused and
the load falls back to the one before, a pickle never runs code, and one that verifies but cannot
be loaded is refused too. Real files in tmp_path, real torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.trainer.checkpoint.training_states import assert_same, saved_at, training_state
from trainer.checkpoint import FORMAT_VERSION, CheckpointError, CheckpointManager

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
    saved_at(tmp_path, 1, 2).close()
    reason = corrupt(tmp_path / "step-2")
    refused: list[tuple[int, str]] = []
    manager = CheckpointManager(tmp_path, on_refused=lambda step, why: refused.append((step, why)))

    assert manager.verify(2) == (False, reason)
    assert manager.verify(1) == (True, "ok")
    assert manager.verified_steps() == [1]

    step, loaded = manager.load(-1)
    assert step == 1 and refused == [(2, reason)]
    assert_same(training_state(1)["model"], loaded["model"])

    refused.clear()
    assert manager.load(2)[0] == 1 and refused == [(2, reason)]


def test_load_of_a_missing_step_falls_back_and_nothing_verified_raises(tmp_path: Path) -> None:
    refused: list[tuple[int, str]] = []
    manager = saved_at(tmp_path, 1, 3, on_refused=lambda step, why: refused.append((step, why)))
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
    saved_at(tmp_path, 10, 20)
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
