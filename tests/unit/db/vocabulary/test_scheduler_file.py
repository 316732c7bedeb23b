"""The scheduler file (db/vocabulary/scheduler_file.py): rewritten in place, so that a full disk
cannot stop it, and read back whole or not at all.
"""

from __future__ import annotations

from pathlib import Path

from db.vocabulary.scheduler_file import FILE_SIZE, SchedulerFile, read_scheduler_file

# -- the database that cannot be written -------------------------------------------------------


def test_scheduler_file_is_rewritten_in_place_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    writer = SchedulerFile(path)
    assert writer.write({"written_at": 1.0, "db_error": None})
    inode, size = path.stat().st_ino, path.stat().st_size
    assert writer.write({"written_at": 2.0, "db_error": "database not writable: database or disk is full"})

    assert path.stat().st_ino == inode and path.stat().st_size == size == FILE_SIZE
    assert read_scheduler_file(path) == {"written_at": 2.0,
                                         "db_error": "database not writable: database or disk is full"}
    path.write_bytes(b'{"written_at": 3.')  # caught half-written
    assert read_scheduler_file(path) is None
