"""The writer thread's part of a save (trainer/checkpoint/writing.py): a writer that fails midway or
is killed mid-write leaves no step and surfaces its error, and a new writer removes what a dead
one left. Real files in tmp_path, real torch, no mocks of the file system.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.paths import ROOT
from tests.unit.trainer.checkpoint.training_states import saved_at, training_state
from trainer.checkpoint import CheckpointError, CheckpointManager
from trainer.checkpoint import io as checkpoint_io

# -- atomicity --------------------------------------------------------------------------


def test_writer_failing_midway_leaves_no_step_and_surfaces_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = saved_at(tmp_path, 1)
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
    manager.save(3, training_state())  # the manager still works after a failed write
    assert manager.wait() is not None and manager.verified_steps() == [1, 3]


def test_previous_async_failure_is_raised_by_the_next_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = CheckpointManager(tmp_path)
    monkeypatch.setattr(checkpoint_io._HashingFile, "_write_all", lambda self, view: 1 / 0)
    manager.save(1, training_state())
    with pytest.raises(CheckpointError, match="step 1"):
        manager.save(2, training_state())
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
    saved_at(tmp_path, 1).close()
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
