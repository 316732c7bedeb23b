"""The files of a script's own checkpoints (``checkpoints.source = "script"``): is a file still
the version runyard recorded, and a copy that is verified before it counts.

A version is a file's (size, modification time): a script that rewrites ``out/ckpt.pt`` in place
makes a new version, and the recorded row of the old one no longer describes the file. Only the
standard library: the UI, the CLI and the scheduler all use it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from db import DatabaseError

CHUNK = 8 << 20
# st_mtime survives a round trip through a SQLite REAL exactly; the tolerance covers other databases.
MTIME_TOLERANCE_S = 1e-6


class CopyRefused(DatabaseError):
    """A script checkpoint file could not be copied as the recorded version."""


def is_version(path: str | Path, size: int, mtime: float | None) -> bool:
    """Whether ``path`` is there with this size and modification time (the recorded version)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_size == size and mtime is not None and abs(st.st_mtime - mtime) <= MTIME_TOLERANCE_S


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def copy_verified(source: str | Path, target: str | Path, sha256: str, mtime: float | None = None) -> None:
    """Copy ``source`` to ``target`` atomically (a temporary file beside it, fsynced, then renamed)
    when its bytes hash to ``sha256``; ``target`` keeps ``mtime`` as its modification time.

    Raises:
        CopyRefused: ``source`` is gone, unreadable, or not the recorded version any more (the
            script overwrote it): ``target`` is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.runyard-tmp")
    digest = hashlib.sha256()
    try:
        with open(source, "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CopyRefused(f"cannot copy {source} to {target}: {exc}") from exc
    if digest.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise CopyRefused(f"{source} is not the recorded version any more (sha256 {digest.hexdigest()[:12]}, "
                          f"recorded {sha256[:12]}): the script rewrote it")
    if mtime is not None:
        os.utime(tmp, (mtime, mtime))
    os.replace(tmp, target)
