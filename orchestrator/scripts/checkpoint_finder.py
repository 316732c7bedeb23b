"""The checkpoint files a script writes itself (``[workload] checkpoint_glob``, e.g.
``out/ckpt.pt``, ``snapshot.pt``, ``checkpoints/*.pt``): listed with size, modification time and
sha256.

A file is hashed only once it is *stable*: the same size and modification time at two looks in
a row (``torch.save`` writes in place, so a file that is still growing must not be called a
checkpoint). Hashing is incremental, a bounded number of bytes per :meth:`CheckpointFiles.scan`,
and its result is kept by (path, size, mtime): a 10 GB checkpoint is hashed once, not every
tick. A file that changes while it is hashed starts over.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from db.config import relative_path_problem
from orchestrator.scripts import ScriptWatchError

GLOB_FIELD = "workload.checkpoint_glob"
MAX_MATCHES = 1000  # files one pattern may match; more is a pattern that is too wide
CHUNK = 8 << 20


class CheckpointGlobError(ScriptWatchError):
    """A ``checkpoint_glob`` that cannot be used."""


def check_glob(pattern: object, field_name: str = GLOB_FIELD) -> str | None:
    """The problem with a checkpoint pattern, naming the field and the value, or None. It must be
    a relative path inside the working directory (no ``..``, not absolute)."""
    if not isinstance(pattern, str):
        return f"{field_name} must be a path pattern such as 'out/ckpt.pt', not {pattern!r}"
    return relative_path_problem(field_name, pattern)


@dataclass(frozen=True)
class CheckpointFile:
    """One file that matches the pattern.

    Attributes:
        path: Absolute path.
        size: Bytes.
        mtime: Modification time (seconds since the epoch).
        sha256: Hex digest, once the file was stable and fully hashed; None before.
        stable: Unchanged since the previous look.
    """

    path: Path
    size: int
    mtime: float
    sha256: str | None
    stable: bool


@dataclass
class _Hashing:
    """A hash in progress: the file's identity when it began, and how far it got."""

    key: tuple[int, int, int]  # (size, mtime_ns, inode)
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    offset: int = 0


class CheckpointFiles:
    """The files under ``workdir`` that match ``patterns``, hashed once they stop changing.

    Args:
        workdir: The script's working directory; patterns are relative to it, and a match that
            resolves outside it (a symlink) is left out.
        patterns: ``checkpoint_glob`` values (``**`` allowed).
        hash_budget: The most bytes one :meth:`scan` hashes, over all files.
    """

    def __init__(self, workdir: Path, patterns: Sequence[str], hash_budget: int = 256 << 20):
        problems = [p for p in (check_glob(x) for x in patterns) if p]
        if problems:
            raise CheckpointGlobError("; ".join(problems))
        self.workdir = workdir.resolve()
        self.patterns = list(patterns)
        self.hash_budget = hash_budget
        self._seen: dict[Path, tuple[int, int, int]] = {}  # the identity at the previous look
        self._hashing: dict[Path, _Hashing] = {}
        self._done: dict[tuple[Path, int, int, int], str] = {}  # (path, size, mtime_ns, inode) -> sha256
        self._files: list[CheckpointFile] = []

    def _matches(self) -> list[Path]:
        found: set[Path] = set()
        for pattern in self.patterns:
            for i, name in enumerate(glob.iglob(str(self.workdir / pattern), recursive=True)):
                if i >= MAX_MATCHES:
                    break
                path = Path(name)
                if path.is_file() and path.resolve().is_relative_to(self.workdir):
                    found.add(path)
        return sorted(found)

    def scan(self) -> list[CheckpointFile]:
        """Look at the files again; hash the stable ones (within the budget). Returns every
        matching file, newest first."""
        budget = self.hash_budget
        files: list[CheckpointFile] = []
        current: dict[Path, tuple[int, int, int]] = {}
        for path in self._matches():
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_size, st.st_mtime_ns, st.st_ino)
            current[path] = key
            stable = self._seen.get(path) == key
            digest = self._done.get((path, *key))
            if digest is None and stable and budget > 0:
                digest, budget = self._hash(path, key, budget)
            files.append(CheckpointFile(path, st.st_size, st.st_mtime, digest, stable))
        self._seen = current
        self._hashing = {p: h for p, h in self._hashing.items() if p in current}
        self._done = {k: v for k, v in self._done.items() if current.get(k[0]) == k[1:]}
        self._files = sorted(files, key=lambda f: (f.mtime, str(f.path)), reverse=True)
        return list(self._files)

    def _hash(self, path: Path, key: tuple[int, int, int], budget: int) -> tuple[str | None, int]:
        """Hash up to ``budget`` more bytes of ``path``; (the digest when finished, budget left)."""
        state = self._hashing.get(path)
        if state is None or state.key != key:
            state = self._hashing[path] = _Hashing(key)  # new, or changed since the hash began
        try:
            with open(path, "rb") as f:
                f.seek(state.offset)
                while budget > 0 and state.offset < key[0]:
                    chunk = f.read(min(CHUNK, budget, key[0] - state.offset))
                    if not chunk:
                        break
                    state.digest.update(chunk)
                    state.offset += len(chunk)
                    budget -= len(chunk)
                st = os.fstat(f.fileno())
        except OSError:
            self._hashing.pop(path, None)
            return None, budget
        if (st.st_size, st.st_mtime_ns, st.st_ino) != key:
            self._hashing.pop(path, None)  # written to while hashed: start over once it is stable again
            return None, budget
        if state.offset < key[0]:
            return None, budget
        digest = state.digest.hexdigest()
        done = (path, *key)  # named: mypy for 3.10 reads self._done[(path, *key)] as 3.11's [path, *key]
        self._done[done] = digest
        self._hashing.pop(path, None)
        return digest, budget

    def stable_files(self) -> list[CheckpointFile]:
        """The files of the last :meth:`scan` that are stable and hashed, newest first: the ones
        a resume may use."""
        return [f for f in self._files if f.stable and f.sha256 is not None]
