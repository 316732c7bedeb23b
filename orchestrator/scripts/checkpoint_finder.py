"""The checkpoint files a script writes itself (``[workload] checkpoint_glob``, e.g.
``out/ckpt.pt``, ``snapshot.pt``, ``checkpoints/*.pt``): listed with size, modification time and
sha256.

A file is hashed only once it is *stable*: the same size and modification time at two looks in
a row (``torch.save`` writes in place, so a file that is still growing must not be called a
checkpoint) and, where its format has no end of its own to check, unchanged for
:data:`SETTLE_S` seconds (a zip archive, ``torch.save``'s format, has its end record, which
orchestrator/scripts/checkpoint_custody.py checks). Hashing is incremental, a bounded number of
bytes per :meth:`CheckpointFiles.scan`, and its result is kept by (path, size, mtime): a 10 GB
checkpoint is hashed once, not every tick. A file that changes while it is hashed starts over.

A file the script rewrites faster than the scheduler looks (nanoGPT's ``out/ckpt.pt`` saved every
0.2 s) is never the same at two looks. Such a file is still read as a *snapshot*, at most once
every :data:`SNAPSHOT_EVERY_S`, when it is a zip archive (``torch.save``'s format) with its end
record (which ``torch.save`` writes last) and it did not change from before it was read to after
its step was: a complete version, read whole. A file in another format that never stops changing
is not recorded until it does (its completeness cannot be told). Without this, the recorded
version fell thousands of steps behind such a file.

A match that is a folder (Hugging Face's ``hf_out/checkpoint-350/``) is one checkpoint: its size
is the sum of its files', its time its newest file's, and it is stable when neither nor the number
of its files changed between two looks *and* it is complete: a folder laid out like a framework's
checkpoint holds the file that framework writes last (the Trainer's ``trainer_state.json``, DCP's
``.metadata``: orchestrator/scripts/checkpoint_layouts.py), and any other folder has not changed
for :data:`SETTLE_S` seconds. Two looks half a second apart were not enough: the real Trainer's
folder sat still with its weights alone for longer than that on 2 saves of 9. Its sha256 is
``db.file_versions.folder_digest`` over its files' own, each hashed as above.

When the attempt has ended (:meth:`CheckpointFiles.writer_gone`), nothing writes the files any
more: no settle time is waited for, and a folder still without its framework's last file is
reported once as stable but *incomplete* (:attr:`CheckpointFile.incomplete`), so the custody
records it refused rather than never.

Each stable version's step is read from the checkpoint itself once
(orchestrator/scripts/checkpoint_steps.py), here, before the scheduler's transaction writes.
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from db.file_versions import folder_digest, folder_files
from db.vocabulary.config import relative_path_problem
from orchestrator.scripts import ScriptWatchError
from orchestrator.scripts.checkpoint_layouts import incomplete, layout_of
from orchestrator.scripts.checkpoint_steps import step_in_checkpoint

GLOB_FIELD = "workload.checkpoint_glob"
MAX_MATCHES = 1000  # files one pattern may match; more is a pattern that is too wide
CHUNK = 8 << 20
# A file that never stops changing is read as a snapshot at most this often (see the module doc).
SNAPSHOT_EVERY_S = 30.0
# A checkpoint without a completion marker of its own (a folder of no known layout, accelerate's,
# a file that is not a zip archive) counts once it has not changed for this long. A writer that
# pauses longer between two files makes a version that the next look replaces, and a retry that
# fails loading it falls back to the one before (orchestrator/scripts/checkpoint_loads.py).
SETTLE_S = 5.0
ZIP_MAGIC = b"PK\x03\x04"  # a zip archive's first bytes (torch.save's format); custody reads it too


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
        stable: Unchanged since the previous look, or a complete zip read whole while it did not
            change (a snapshot of a file that never stops changing: see the module doc).
        step: The step the checkpoint itself holds (read once it is stable), or None.
        folder: Whether it is a folder of files (one checkpoint).
        incomplete: Why it is not a complete checkpoint (its framework's last file is missing),
            said only once its writer is gone (:meth:`CheckpointFiles.writer_gone`); else None.
    """

    path: Path
    size: int
    mtime: float
    sha256: str | None
    stable: bool
    step: int | None = None
    folder: bool = False
    incomplete: str | None = None


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
        step_keys: Top-level keys of a ``torch.save`` dict that hold the step (``checkpoint_step_key``).
        settle_s: How long a checkpoint without a completion marker must stay unchanged.
    """

    def __init__(self, workdir: Path, patterns: Sequence[str], hash_budget: int = 256 << 20,
                 step_keys: Sequence[str] = (), settle_s: float = SETTLE_S):
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
        self._steps: dict[tuple[Path, int, int, int], int | None] = {}  # a stable version's own step
        self._stable_at: dict[Path, float] = {}  # when a version of the path was last stable (monotonic)
        self._changed_at: dict[Path, float] = {}  # when the path was first seen as it is now (monotonic)
        self._zipped: dict[tuple[Path, int, int, int], bool] = {}  # a file version: a zip archive?
        self.step_keys = tuple(step_keys)
        self.settle_s = settle_s
        self.writer_done = False  # the attempt ended: see writer_gone()
        self.looks = 0  # how many scans ran

    def _matches(self) -> list[Path]:
        """The files and folders the patterns match inside the workdir. A pattern that ends in
        ``**`` matches files only (as it always did: ``out/**`` is every file under ``out/``, not
        ``out/`` as one checkpoint); a match inside a matched folder is part of that folder."""
        found: set[Path] = set()
        for pattern in self.patterns:
            folders = Path(pattern).name != "**"
            for i, name in enumerate(glob.iglob(str(self.workdir / pattern), recursive=True)):
                if i >= MAX_MATCHES:
                    break
                path = Path(name)
                wanted = path.is_file() or (folders and path.is_dir() and path != self.workdir)
                if wanted and path.resolve().is_relative_to(self.workdir):
                    found.add(path)
        dirs = {p for p in found if p.is_dir()}
        return sorted(p for p in found if not any(parent in dirs for parent in p.parents))

    def writer_gone(self) -> None:
        """The attempt has ended and nothing writes the files any more: from now on no settle
        time is waited for, and a folder without its framework's last file is reported stable
        and incomplete (the custody records it refused)."""
        self.writer_done = True

    def scan(self) -> list[CheckpointFile]:
        """Look at the files again; hash the stable ones (within the budget). Returns every
        matching file or folder, newest first."""
        self.looks += 1
        budget = self.hash_budget
        now = time.monotonic()
        files: list[CheckpointFile] = []
        current: dict[Path, tuple[int, int, int]] = {}
        members: dict[Path, tuple[int, int, int]] = {}  # the files of matched folders
        for path in self._matches():
            if path.is_dir():
                found = self._folder(path, members)
                if found is None:
                    continue
                key, mtime, inner = found
            else:
                try:
                    st = path.stat()
                except OSError:
                    continue
                key, mtime, inner = (st.st_size, st.st_mtime_ns, st.st_ino), st.st_mtime, None
            current[path] = key
            unchanged = self._seen.get(path) == key
            if not unchanged:
                self._changed_at[path] = now
            names = [f.relative_to(path).as_posix() for f, _ in inner] if inner is not None else None
            missing = incomplete(path.name, names) if names is not None else None
            # Unchanged since the last look, complete by its framework's last file (reported
            # incomplete once its writer is gone), and settled where its format has no end to check.
            stable = (unchanged and (missing is None or self.writer_done)
                      and self._settled(path, key, names, now))
            digest = self._done.get((path, *key))
            if digest is None and stable and budget > 0:
                if inner is None:
                    digest, budget = self._hash(path, key, budget)
                else:
                    digest, budget = self._hash_folder(path, key, inner, budget)
            elif not stable and inner is None and self._snapshot_due(path) and 0 < key[0] <= budget:
                digest, budget = self._snapshot(path, key, budget)
                stable = digest is not None
            step = self._step(path, key) if stable else None
            if stable:
                self._stable_at[path] = now
            files.append(CheckpointFile(path, key[0], mtime, digest, stable, step, inner is not None,
                                        missing if stable else None))
        self._seen = current
        alive = {**current, **members}
        self._hashing = {p: h for p, h in self._hashing.items() if p in alive}
        self._done = {k: v for k, v in self._done.items() if alive.get(k[0]) == k[1:]}
        self._steps = {k: v for k, v in self._steps.items() if current.get(k[0]) == k[1:]}
        self._zipped = {k: v for k, v in self._zipped.items() if current.get(k[0]) == k[1:]}
        self._stable_at = {p: t for p, t in self._stable_at.items() if p in current}
        self._changed_at = {p: t for p, t in self._changed_at.items() if p in current}
        self._files = sorted(files, key=lambda f: (f.mtime, str(f.path)), reverse=True)
        return list(self._files)

    def _settled(self, path: Path, key: tuple[int, int, int], names: list[str] | None, now: float) -> bool:
        """Whether a version needs no more waiting: its format has an end of its own (a zip
        archive's end record, a framework's last file that no other file follows), or it has not
        changed for :attr:`settle_s`, or its writer is gone."""
        if names is not None:
            layout = layout_of(path.name, names)
            marked = layout is not None and not layout.settle
        else:
            marked = self._is_zip(path, key)
        return marked or self.writer_done or now - self._changed_at.get(path, now) >= self.settle_s

    def _is_zip(self, path: Path, key: tuple[int, int, int]) -> bool:
        """Whether a file version starts like a zip archive (its completeness is its end record)."""
        done = (path, *key)
        if done not in self._zipped:
            try:
                with open(path, "rb") as f:
                    self._zipped[done] = f.read(4) == ZIP_MAGIC
            except OSError:
                return False
        return self._zipped[done]

    def _folder(self, path: Path, members: dict[Path, tuple[int, int, int]]
                ) -> tuple[tuple[int, int, int], float, list[tuple[Path, tuple[int, int, int]]]] | None:
        """A folder's identity (total size, newest file's mtime_ns, file count), its time, and its
        files with their own identities; None when it cannot be read."""
        inner = []
        try:
            for f in folder_files(path):
                st = f.stat()
                inner.append((f, (st.st_size, st.st_mtime_ns, st.st_ino)))
        except OSError:
            return None
        if not inner:
            return None  # nothing written into it yet
        members.update(inner)
        newest = max((k[1] for _, k in inner), default=0)
        return (sum(k[0] for _, k in inner), newest, len(inner)), newest / 1e9, inner

    def _hash_folder(self, path: Path, key: tuple[int, int, int], inner: list[tuple[Path, tuple[int, int, int]]],
                     budget: int) -> tuple[str | None, int]:
        """Hash a folder's files (each as a file, within ``budget``); its digest once all are."""
        entries = []
        for f, fkey in inner:
            digest = self._done.get((f, *fkey))
            if digest is None and budget > 0:
                digest, budget = self._hash(f, fkey, budget)
            if digest is None:
                return None, budget
            entries.append((f.relative_to(path).as_posix(), digest))
        digest = folder_digest(entries)
        done = (path, *key)
        self._done[done] = digest
        return digest, budget

    def _step(self, path: Path, key: tuple[int, int, int]) -> int | None:
        """The step a stable version holds, read once (orchestrator/scripts/checkpoint_steps.py)."""
        done = (path, *key)
        if done not in self._steps:
            self._steps[done] = step_in_checkpoint(path, self.step_keys)
        return self._steps[done]

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

    def _snapshot_due(self, path: Path) -> bool:
        return time.monotonic() - self._stable_at.get(path, -math.inf) >= SNAPSHOT_EVERY_S

    def _snapshot(self, path: Path, key: tuple[int, int, int], budget: int) -> tuple[str | None, int]:
        """A version of a file that changed since the last look, read whole now: its digest when it
        is a complete zip and did not change from before it was read to after its step was;
        else None (and the next look tries again, once the snapshot is due). A file without its
        zip end record (one being written) is not read at all."""
        if not self._complete_zip(path, key):
            return None, budget
        digest, budget = self._hash(path, key, budget)
        if digest is None:
            return None, budget
        self._step(path, key)  # read now, from the same version
        if not self._complete_zip(path, key):
            self._done.pop((path, *key), None)
            self._steps.pop((path, *key), None)
            return None, budget
        return digest, budget

    @staticmethod
    def _complete_zip(path: Path, key: tuple[int, int, int]) -> bool:
        """Whether ``path`` is still the version ``key`` and a zip archive with its end record."""
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                return ((st.st_size, st.st_mtime_ns, st.st_ino) == key and f.read(4) == ZIP_MAGIC
                        and zipfile.is_zipfile(f))
        except OSError:
            return False

    def stable_files(self) -> list[CheckpointFile]:
        """The files of the last :meth:`scan` that are stable, complete and hashed, newest first:
        the ones a resume may use."""
        return [f for f in self._files if f.stable and f.sha256 is not None and f.incomplete is None]
