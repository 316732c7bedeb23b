"""Scalars from the TensorBoard event files a script writes, read live with the ``tensorboard``
package's own event-file reader (the ``scripts`` extra: ``pip install 'runyard[scripts]'``).

``torch.utils.tensorboard.SummaryWriter``, tensorboardX and Lightning's ``TensorBoardLogger``
all write the same format. Every tag keeps the step the script gave it: a tag logged every 10
steps and another logged per epoch stay on their own counters (never renumbered into one, the
trouble with W&B's ``sync_tensorboard``). Values of ``add_scalars`` (written to
``<logdir>/<tag>_<name>/``) become ``<tag>/<name>``.

The rank of a file: its writer's pid (file names are
``events.out.tfevents.<time>.<host>.<pid>.<n>``) looked up in the ``{pid: rank}`` table the
caller gives, else a ``rank<N>`` / ``rank_<N>`` folder on its path, else 0 (most scripts write
on rank 0 only).

Default folders: every ``runs/``, ``lightning_logs/`` or ``tb/`` under the working directory (a
few levels deep, skipping hidden folders and virtual environments).

Steps are counted as runyard counts them, step N being the Nth optimizer step, which is how
``SummaryWriter`` scripts, the Hugging Face ``Trainer`` (its ``global_step`` after the step) and
the checkpoints of all of them count. Lightning's loggers number from 0: its first step logs at
step 0, and its checkpoint after 20 steps holds ``global_step`` 20 while the step after it logs
at 20. A file Lightning's ``TensorBoardLogger`` wrote (its folder holds the logger's
``hparams.yaml``, written at the start of ``fit`` before any value) has its steps read one
higher, so that a retry's steps lost, its first step after a resume and the run's last step
against ``max_steps`` are true.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorboard import data_compat
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.compat.proto import summary_pb2
from tensorboard.util import tensor_util

from orchestrator.scripts import Sample

logger = logging.getLogger(__name__)

DEFAULT_DIR_NAMES = ("runs", "lightning_logs", "tb")
EVENT_FILE_PREFIX = "events.out.tfevents."
SEARCH_DEPTH = 3  # workdir/runs, workdir/a/runs, workdir/a/b/runs
MAX_ENTRIES = 20_000  # directory entries one search looks at, so a workdir of $HOME stays cheap
_SKIP_DIRS = frozenset({"node_modules", "__pycache__", "site-packages", "dist-packages", ".git"})
_FILE_NAME = re.compile(r"^events\.out\.tfevents\.(?P<time>\d+)\.(?P<host>.+)\.(?P<pid>\d+)\.(?P<uid>\d+)")
_RANK_DIR = re.compile(r"^rank[_-]?(\d+)$", re.I)
_SCALARS = "scalars"


@dataclass(frozen=True)
class EventFileName:
    """What an event file's name says about its writer."""

    created: int
    host: str
    pid: int


def parse_file_name(name: str) -> EventFileName | None:
    """The creation time, host and pid in ``events.out.tfevents.<time>.<host>.<pid>.<n>[suffix]``
    (a host name may hold dots), or None for another name."""
    m = _FILE_NAME.match(name)
    return EventFileName(int(m["time"]), m["host"], int(m["pid"])) if m else None


def rank_of_pid(pid: int | None, pid_ranks: Mapping[int, int] | None) -> int | None:
    """The rank of the process ``pid`` in the caller's ``{pid: rank}`` table, or None."""
    if pid is None or not pid_ranks:
        return None
    return pid_ranks.get(pid)


def rank_of_file(path: Path, pid_ranks: Mapping[int, int] | None = None, root: Path | None = None) -> int:
    """The rank that wrote an event file: by its writer's pid, else a ``rank<N>`` folder between
    ``root`` and the file, else 0."""
    parsed = parse_file_name(path.name)
    rank = rank_of_pid(parsed.pid if parsed else None, pid_ranks)
    if rank is not None:
        return rank
    parts = path.parent.relative_to(root).parts if root is not None and path.is_relative_to(root) else path.parent.parts
    for part in reversed(parts):
        if (m := _RANK_DIR.match(part)) is not None:
            return int(m[1])
    return 0


def default_dirs(workdir: Path, names: Sequence[str] = DEFAULT_DIR_NAMES, depth: int = SEARCH_DEPTH,
                 max_entries: int = MAX_ENTRIES) -> list[Path]:
    """Every folder named ``runs``, ``lightning_logs`` or ``tb`` under ``workdir``, at most
    ``depth`` levels down; hidden folders, virtual environments and package folders are skipped,
    and the search stops after ``max_entries`` directory entries."""
    found: list[Path] = []
    seen = 0
    level = [workdir]
    for _ in range(depth):
        below: list[Path] = []
        for folder in level:
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            seen += len(entries)
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False) or entry.name.startswith(".") or entry.name in _SKIP_DIRS:
                    continue
                path = Path(entry.path)
                if entry.name in names:
                    found.append(path)
                elif not (path / "pyvenv.cfg").exists():
                    below.append(path)
            if seen >= max_entries:
                return sorted(found)
        level = below
    return sorted(found)


def find_event_files(dirs: Sequence[Path], max_entries: int = MAX_ENTRIES) -> list[Path]:
    """The event files under ``dirs`` (any depth), at most ``max_entries`` entries looked at."""
    files: list[Path] = []
    seen = 0
    for top in dirs:
        for root, subdirs, names in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
            seen += len(subdirs) + len(names)
            files.extend(Path(root) / n for n in sorted(names) if n.startswith(EVENT_FILE_PREFIX))
            if seen >= max_entries:
                return files
    return files


def _metric_key(tag: str, path: Path) -> str:
    """``add_scalars("loss", {"train": ...})`` writes tag "loss" into ``<logdir>/loss_train/``:
    that becomes "loss/train"; any other tag is kept as it is."""
    folder = path.parent.name
    stem = tag.replace("/", "_") + "_"
    if folder.startswith(stem) and len(folder) > len(stem):
        return f"{tag}/{folder[len(stem):]}"
    return tag


@dataclass
class _EventFile:
    """One event file being read: its reader (which keeps its place) and what it learnt."""

    path: Path
    root: Path
    loader: Any
    plugins: dict[str, str] = field(default_factory=dict)  # tag -> plugin, from the tag's first value
    size: int = 0
    read_size: int = -1  # the size at the last complete read
    step_offset: int | None = None  # added to its steps: 1 for Lightning's, decided at its first value


LIGHTNING_HPARAMS = "hparams.yaml"  # what Lightning's TensorBoardLogger writes beside its event file


def step_offset(path: Path) -> int:
    """What to add to the steps of the event file ``path``: 1 where Lightning's TensorBoardLogger
    wrote it (steps from 0; module docstring), else 0."""
    return 1 if (path.parent / LIGHTNING_HPARAMS).is_file() else 0


def _scalars(event: Any, plugins: dict[str, str]) -> Iterator[tuple[str, float]]:
    """(tag, value) of each scalar in one event: TF1-style ``simple_value`` and the tensors of
    the ``scalars`` plugin, whose metadata comes only with a tag's first value."""
    for value in event.summary.value:
        if value.HasField("simple_value"):  # what SummaryWriter.add_scalar writes: no conversion needed
            plugins.setdefault(value.tag, _SCALARS)
            yield value.tag, float(value.simple_value)
            continue
        migrated = data_compat.migrate_value(value)
        metadata = migrated.metadata
        plugin = metadata.plugin_data.plugin_name or (_SCALARS if metadata.data_class == summary_pb2.DATA_CLASS_SCALAR
                                                      else "")
        if plugin:
            plugins.setdefault(value.tag, plugin)
        if plugins.get(value.tag) != _SCALARS or not migrated.HasField("tensor"):
            continue
        array = tensor_util.make_ndarray(migrated.tensor)
        if array.size == 1:
            yield value.tag, float(array.reshape(()).item())


class EventFiles:
    """The scalars of the event files under some folders, read incrementally.

    Args:
        dirs: The folders to watch (they may not exist yet), or a function that lists them, called
            at each search (the default folders appear only once the script creates them).
        since: Only files modified at or after this time (the attempt's start): the files of
            earlier attempts in the same folders are not read again.
        pid_ranks: ``{pid: rank}`` of the script's processes; :meth:`set_pid_ranks` updates it.
        max_events: The most events one :meth:`poll` reads, over all files.
        rescan_s: How often the folders are searched for new files.
        clock: Monotonic time (tests pass their own).
    """

    def __init__(self, dirs: Sequence[Path] | Callable[[], Sequence[Path]], *, since: float | None = None,
                 pid_ranks: Mapping[int, int] | None = None, max_events: int = 5_000, rescan_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.dirs = dirs
        self.since = since
        self.pid_ranks = dict(pid_ranks or {})
        self.max_events = max_events
        self.rescan_s = rescan_s
        self._clock = clock
        self._files: dict[Path, _EventFile] = {}
        self._scanned_at: float | None = None
        self.newest_step: int | None = None
        self.grew_at: float | None = None  # the newest modification time of a file that grew
        self.behind = False  # the last poll stopped at max_events

    def set_pid_ranks(self, pid_ranks: Mapping[int, int]) -> None:
        """Learn which pid is which rank (files already read keep the ranks they were read with)."""
        self.pid_ranks = dict(pid_ranks)

    def _scan(self) -> None:
        now = self._clock()
        if self._scanned_at is not None and now - self._scanned_at < self.rescan_s:
            return
        self._scanned_at = now
        for top in (self.dirs() if callable(self.dirs) else self.dirs):
            for path in find_event_files([top]):
                if path in self._files:
                    continue
                try:
                    mtime = path.stat().st_mtime
                except OSError:
                    continue
                if self.since is not None and mtime < self.since:
                    continue
                try:
                    loader = LegacyEventFileLoader(str(path))
                except Exception as exc:  # noqa: BLE001 - the reader's error types differ (stub or TensorFlow)
                    logger.warning("cannot read TensorBoard file %s: %s", path, exc)
                    continue
                self._files[path] = _EventFile(path, top, loader)

    def poll(self, final: bool = False) -> list[Sample]:
        """The scalars written since the last call, at most ``max_events`` events' worth.

        Args:
            final: The writers have exited: search the folders again now (not only every
                ``rescan_s``), so that files created in their last second are read too.
        """
        if final:
            self._scanned_at = None
        self._scan()
        samples: list[Sample] = []
        budget = self.max_events
        self.behind = False
        for state in sorted(self._files.values(), key=lambda f: f.read_size - f.size):  # the most behind first
            try:
                st = state.path.stat()
            except OSError:
                continue
            state.size = st.st_size
            if state.size == state.read_size:
                continue
            read, complete = self._read(state, budget, samples)
            budget -= read
            if complete:
                state.read_size = state.size
            self.grew_at = max(self.grew_at or st.st_mtime, st.st_mtime)
            if budget <= 0:
                self.behind = True
                break
        if samples:
            newest = max(s.step for s in samples)
            self.newest_step = newest if self.newest_step is None else max(self.newest_step, newest)
        return samples

    def _read(self, state: _EventFile, budget: int, out: list[Sample]) -> tuple[int, bool]:
        """Read up to ``budget`` events of one file into ``out``; (events read, reached its end)."""
        rank = rank_of_file(state.path, self.pid_ranks, state.root)
        count = 0
        for event in state.loader.Load():
            count += 1
            if event.HasField("summary") and event.step >= 0:
                for tag, value in _scalars(event, state.plugins):
                    if state.step_offset is None:
                        state.step_offset = step_offset(state.path)
                    out.append(Sample(rank, int(event.step) + state.step_offset, _metric_key(tag, state.path), value,
                                      event.wall_time))
            if count >= budget:
                return count, False  # the reader keeps its place; the next poll goes on from here
        return count, True


def import_logdir(path: Path, pid_ranks: Mapping[int, int] | None = None) -> Iterator[Sample]:
    """Every scalar of every event file under ``path`` (for ``runyard import tensorboard LOGDIR``),
    file by file, each tag with its own steps. The rank of each file as :func:`rank_of_file`
    says (relative to ``path``)."""
    for file in find_event_files([path], max_entries=10_000_000):
        plugins: dict[str, str] = {}
        rank = rank_of_file(file, pid_ranks, path)
        offset = step_offset(file)
        for event in LegacyEventFileLoader(str(file)).Load():
            if event.HasField("summary") and event.step >= 0:
                for tag, value in _scalars(event, plugins):
                    yield Sample(rank, int(event.step) + offset, _metric_key(tag, file), value, event.wall_time)
