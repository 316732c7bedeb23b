"""The shim (orchestrator/executors/shim.py) on a folder that turns read-only or a disk that fills:
its exit file is written once it can be, and the launch record's second version has its page.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from orchestrator.executors import shim as shim_module
from tests.unit.orchestrator.mounts import WAITER, remount, text_of, tmpfs, wait_for


def _shim(exit_file: Path, go: Path, code: int, log: Path, retry_s: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RUNYARD_EXIT_RETRY_S": retry_s}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "orchestrator.executors.shim", "--exit-file", str(exit_file),
                                 "--", sys.executable, "-c", WAITER, str(go), str(code)],
                                stdout=out, stderr=out, env=env)


def test_a_shim_whose_folder_turns_read_only_writes_its_exit_file_once_it_can_naming_the_error(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "mnt") as mnt:
        attempt = mnt / "attempts" / "1"
        attempt.mkdir(parents=True)
        log, go = tmp_path / "shim.log", tmp_path / "go"
        shim = _shim(attempt / "exit.json", go, 3, log, retry_s="20")
        try:
            wait_for("the shim's launch record names torchrun's stand-in",
                      lambda: '"node_pids": [' in text_of(attempt / "launch.json")
                      and '"node_pids": []' not in text_of(attempt / "launch.json"))
            remount(mnt, "ro")  # a real read-only filesystem: the shim keeps no file open on it
            go.touch()
            wait_for("the shim says it cannot write", lambda: "cannot write the exit file" in text_of(log))
            assert not (attempt / "exit.json").exists()
            remount(mnt, "rw")
            assert shim.wait(timeout=10) == 3
        finally:
            go.touch()
            shim.kill()
        record = json.loads((attempt / "exit.json").read_text())
    assert record["exit_code"] == 3
    assert record["storage_error"]["errno"] == errno.EROFS
    assert "Read-only file system" in record["storage_error"]["message"]
    assert str(attempt) in record["storage_error"]["path"]


def test_on_a_full_disk_the_shim_still_writes_its_exit_file(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", "size=1m") as mnt:
        attempt = mnt / "attempts" / "1"
        attempt.mkdir(parents=True)
        log, go = tmp_path / "shim.log", tmp_path / "go"
        shim = _shim(attempt / "exit.json", go, 4, log, retry_s="0")  # not 1, which a crashed shim exits with
        try:
            wait_for("the shim's launch record", lambda: (attempt / "launch.json").exists())
            with pytest.raises(OSError) as full, open(mnt / "filler", "wb") as filler:  # noqa: PT011, PT012 - fills the disk to ENOSPC
                while True:  # fill the filesystem to the last page
                    filler.write(b"\0" * 65536)
                    filler.flush()
            assert full.value.errno == errno.ENOSPC
            go.touch()
            assert shim.wait(timeout=10) == 4, text_of(log)
        finally:
            go.touch()
            shim.kill()
        record = json.loads((attempt / "exit.json").read_text())  # written into the page reserved at launch
        launch = json.loads((attempt / "launch.json").read_text())
    assert record["exit_code"] == 4 and "storage_error" not in record
    assert launch["torchrun_pid"] == launch["node_pids"][0] > 0  # the second version had its page too


def test_the_launch_record_s_second_version_is_written_on_a_disk_filled_after_the_first(tmp_path: Path) -> None:
    """The order the shim keeps, made deterministic: the disk fills between the two versions
    (the race that once crashed the shim before it could write its exit file)."""
    with tmpfs(tmp_path / "mnt", "size=1m") as mnt:
        record = str(mnt / "launch.json")
        shim_module.reserve(record, suffix=shim_module.LAUNCH_RESERVE)
        shim_module.write_launch_record(record)
        with pytest.raises(OSError) as full, open(mnt / "filler", "wb") as filler:  # noqa: PT011, PT012 - fills the disk to ENOSPC
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        assert full.value.errno == errno.ENOSPC
        shim_module.write_launch_record(record, [psutil.Process()])
        written = json.loads(Path(record).read_text())
    assert written["torchrun_pid"] == os.getpid() and written["node_pids"] == [os.getpid()]
