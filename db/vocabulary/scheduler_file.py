"""The scheduler's heartbeat file: how the UI learns that the scheduler is alive but cannot
write the database.

The heartbeat row in the database goes stale when the database cannot be written (a full disk,
a file-size limit, a read-only file), and the UI would then say "scheduler offline", which is
wrong and unhelpful. So the scheduler also keeps ``<home>/scheduler.json``: a file of a fixed
size, allocated once at start-up and rewritten in place (``pwrite`` at offset 0, no new blocks),
which therefore still works on a full disk. It says when it was written and whether the last
tick could write the database, with the database's own error when it could not.

A reader may catch a write half done: the JSON then does not parse and the reader treats the
file as absent for that look (the next write is 2 s away).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE_SIZE = 4096


class SchedulerFile:
    """The writer, owned by the scheduler process. Opening allocates the file's blocks."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, FILE_SIZE)  # the blocks exist from now on
            except OSError:
                os.ftruncate(fd, FILE_SIZE)
            self._fd = fd
        return self._fd

    def write(self, record: dict[str, Any]) -> bool:
        """Rewrite the file in place with ``record`` (JSON, padded to the fixed size).

        Returns:
            False when even this failed (then nothing more can be said to the UI).
        """
        data = json.dumps(record, default=str).encode()[: FILE_SIZE - 1]
        try:
            fd = self._open()
            os.pwrite(fd, data.ljust(FILE_SIZE, b" "), 0)
        except OSError:
            return False
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_scheduler_file(path: Path) -> dict[str, Any] | None:
    """The newest record, or None when there is none (or it is being rewritten this instant)."""
    try:
        data = json.loads(path.read_bytes().rstrip(b" \0") or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
