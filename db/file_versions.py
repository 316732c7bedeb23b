"""The files of a script's own checkpoints (``checkpoints.source = "script"``): is a file still
the version runyard recorded, and a copy that is verified before it counts.

A version is a file's (size, modification time): a script that rewrites ``out/ckpt.pt`` in place
makes a new version, and the recorded row of the old one no longer describes the file. A
checkpoint that is a folder (Hugging Face's ``checkpoint-350/``) is one version too: its size is
the sum of its files' sizes, its modification time its newest file's, and its sha256 a digest over
its files' relative paths and their own sha256 (:func:`folder_digest`), so a copy that keeps each
file's time is the same version. Only the standard library: the UI, the CLI and the scheduler all
use it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from db import DatabaseError

CHUNK = 8 << 20
# The files one checkpoint folder may hold; more is not a checkpoint but a tree (a pattern too wide).
MAX_FOLDER_FILES = 10_000
# st_mtime survives a round trip through a SQLite REAL exactly; the tolerance covers other databases.
MTIME_TOLERANCE_S = 1e-6


class CopyRefused(DatabaseError):
    """A script checkpoint file could not be copied as the recorded version."""


def folder_files(folder: str | Path) -> list[Path]:
    """The regular files under ``folder`` (symlinks not followed), sorted; at most
    :data:`MAX_FOLDER_FILES`."""
    out: list[Path] = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            if path.is_file() and not path.is_symlink():
                out.append(path)
                if len(out) >= MAX_FOLDER_FILES:
                    return out
    return sorted(out)


def version_of(path: str | Path) -> tuple[int, float] | None:
    """A file's or a folder's (size, modification time) as a version is recorded, or None when
    it is not there."""
    try:
        if not os.path.isdir(path):
            st = os.stat(path)
            return st.st_size, st.st_mtime
        stats = [f.stat() for f in folder_files(path)]
    except OSError:
        return None
    return sum(st.st_size for st in stats), max((st.st_mtime for st in stats), default=0.0)


def is_version(path: str | Path, size: int, mtime: float | None) -> bool:
    """Whether ``path`` (a file or a folder) is there with this size and modification time."""
    found = version_of(path)
    return (found is not None and found[0] == size and mtime is not None
            and abs(found[1] - mtime) <= MTIME_TOLERANCE_S)


def folder_digest(entries: Iterable[tuple[str, str]]) -> str:
    """The sha256 of a checkpoint folder from its files' (relative path, sha256)."""
    digest = hashlib.sha256()
    for name, sha in sorted(entries):
        digest.update(f"{name}\0{sha}\n".encode())
    return digest.hexdigest()


def sha256_of(path: str | Path) -> str:
    """A file's sha256, or a folder's :func:`folder_digest`."""
    if os.path.isdir(path):
        return folder_digest((f.relative_to(path).as_posix(), sha256_of(f)) for f in folder_files(path))
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
    if os.path.isdir(source):
        _copy_folder(Path(source), target, tmp, sha256)
        return
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


def _copy_folder(source: Path, target: Path, tmp: Path, sha256: str) -> None:
    """:func:`copy_verified` for a checkpoint folder: every file copied with its time into a
    temporary folder beside ``target``, the copy's digest checked, then renamed into place."""
    shutil.rmtree(tmp, ignore_errors=True)
    entries = []
    try:
        for f in folder_files(source):
            name = f.relative_to(source).as_posix()
            copy = tmp / name
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, copy)
            entries.append((name, sha256_of(copy)))
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CopyRefused(f"cannot copy {source} to {target}: {exc}") from exc
    found = folder_digest(entries)
    if found != sha256:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CopyRefused(f"{source} is not the recorded version any more (sha256 {found[:12]}, recorded "
                          f"{sha256[:12]}): the script rewrote it")
    os.replace(tmp, target)
