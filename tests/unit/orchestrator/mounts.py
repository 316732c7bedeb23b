"""Real tmpfs mounts for the storage fault tests (they need root and mount(8), and skip with the
reason elsewhere), and a workload that waits for a file, so that no test sleeps a fixed time.

A mount cannot be remounted read-only while a file on it is open for writing (EBUSY), and the
shim's launcher log stays open for the attempt's life: where a running attempt's folder must turn
read-only, a read-only tmpfs is mounted over it instead, which is what every new open of a path
there then meets (EROFS).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# -- read-only, full and deleted folders under real processes (issue 25, item 7) ----------------
#
# Real tmpfs mounts (this needs root and mount(8); the tests skip with the reason elsewhere). A
# mount cannot be remounted read-only while a file on it is open for writing (EBUSY), and the
# shim's launcher log stays open for the attempt's life: where a running attempt's folder must
# turn read-only, a read-only tmpfs is mounted over it instead, which is what every new open of
# a path there then meets (EROFS), the stand-in named in those tests.


@contextlib.contextmanager
def tmpfs(path: Path, options: str = "size=16m") -> Iterator[Path]:
    """A tmpfs mounted at ``path`` for the test's length; unmounted in ``finally``."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True, capture_output=True)


# Waits for a file to appear (argv[1]), then exits with argv[2]; no fixed sleep in the tests.
WAITER = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
sys.exit(int(sys.argv[2]))
"""


def wait_for(what: str, done: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``done`` until it is true; fail saying ``what`` did not happen after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: not in {timeout:.0f} s"
        time.sleep(0.02)


def text_of(path: Path) -> str:
    """The text of ``path``, or "" where it cannot be read (not written yet, or on a mount gone)."""
    try:
        return path.read_text()
    except OSError:
        return ""
