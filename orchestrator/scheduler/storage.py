"""Storage faults: which errors mean the storage failed (not the training code, not runyard),
whether a folder can be written now, and a run folder deleted under a running run.

A read-only mount (EROFS), a full disk (ENOSPC), a quota (EDQUOT), a size limit (EFBIG) and a
failing device (EIO) pass by themselves or by a person's hand; they are ``DISK`` failures, retried
once the folder is writable and has room again (orchestrator/scheduler/admission.py). A run folder that no
longer exists is neither: its config, logs and checkpoints are gone, and no retry can bring them
back.

A storage fault under a running scheduler is told once: :class:`StorageFaults` logs one line
when it starts and one when it is over, and holds the hang watchdog meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from db.vocabulary.layout import CONFIG_FILE

# The errors of a storage that failed, as opposed to a path the code got wrong (ENOENT, EACCES).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO, errno.EROFS})
# The name of the file :func:`writable_problem` writes and removes.
PROBE_NAME = ".runyard-write-probe"
# Bytes the probe writes: a full filesystem refuses even one page.
PROBE_BYTES = 4096
_ERRNO = re.compile(r"\[Errno (\d+)\]")


@dataclass(frozen=True)
class StorageFault:
    """A write that failed for the storage's sake: where, and which errno."""

    path: str
    errno: int
    strerror: str

    @property
    def name(self) -> str:
        """The errno's symbol, e.g. ``EROFS``."""
        return errno.errorcode.get(self.errno, f"errno {self.errno}")

    def describe(self) -> str:
        """``EROFS (Read-only file system) writing in /data/runs/run-000001/attempts/2``"""
        return f"{self.name} ({self.strerror}) writing in {self.path}"


def storage_fault(exc: BaseException, path: Path | str | None = None) -> StorageFault | None:
    """``exc`` as a storage fault when it is one (an OSError with one of STORAGE_ERRNOS), naming
    the file it names, else ``path``; None for any other error."""
    if not isinstance(exc, OSError) or exc.errno not in STORAGE_ERRNOS:
        return None
    where = exc.filename if exc.filename is not None else path
    return StorageFault(str(where) if where is not None else "?", int(exc.errno),
                        exc.strerror or os.strerror(exc.errno))


def errno_in(text: str | None) -> int | None:
    """The errno in an exception line as Python prints it (``[Errno 30] ...``), or None."""
    found = _ERRNO.search(text or "")
    return int(found.group(1)) if found else None


def writable_problem(folder: Path) -> StorageFault | None:
    """Why ``folder`` cannot be written now, or None when it can (or does not exist: see
    :func:`run_dir_deleted`). Tested by writing a small file, fsynced, then removed: ``os.access``
    says nothing about a read-only mount or a full disk."""
    probe = folder / f"{PROBE_NAME}-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except FileNotFoundError:
        return None
    except OSError as exc:
        fault = storage_fault(exc)
        return StorageFault(str(folder), fault.errno, fault.strerror) if fault is not None else None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def run_dir_deleted(run_dir: Path) -> bool:
    """Whether the run's folder was deleted (or emptied: its ``config.json`` is written at
    submission and never removed while the run lives)."""
    return not (run_dir / CONFIG_FILE).is_file()


def sqlite_folder(db_url: str) -> Path | None:
    """The folder of a SQLite database's file (probed in a storage fault), or None for a server's."""
    if not db_url.startswith("sqlite:///") or db_url.startswith("sqlite:///:memory:"):
        return None
    return Path(db_url.removeprefix("sqlite:///").split("?", 1)[0]).parent


def deleted_message(run_dir: Path) -> str:
    """What to say about a run folder deleted under a running run."""
    return (f"the run folder {run_dir} was deleted while the run was running: its config, logs and checkpoints "
            "are gone; not retried (submit the config again to start over)")


_PATH = re.compile(r"(/[^\s'\":,()\[\]]+)")


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a failed write leaves no file behind)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing ancestor)."""
    try:
        return shutil.disk_usage(nearest_existing(path)).free
    except OSError:
        return None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def disk_detail(message: str, attempt_dir: Path) -> str:
    """Where a failed write went, with which errno, how much room is there now and whether its
    folder can be written now: the first absolute path in the message (else the run's folder),
    and the free space on its filesystem."""
    found = _PATH.search(message)
    path = Path(found.group(1)) if found else attempt_dir.parent.parent
    free = free_bytes(path)
    room = f"{human_bytes(free)} free on its filesystem now" if free is not None else "free space unknown"
    code = errno_in(message)
    name = f"{errno.errorcode[code]}: " if code is not None and code in errno.errorcode else ""
    folder = nearest_existing(path.parent)
    # Only the run's own folders are probed (a path in the message may be anywhere).
    problem = writable_problem(folder) if folder.is_relative_to(attempt_dir.parent.parent) else None
    now = f"; still not writable ({problem.name})" if problem is not None else ""
    return f"{name}writing {path}; {room}{now}"


# What a database says when its storage refuses a write (SQLite's words; PostgreSQL's "could not
# extend file ...: No space left on device"). A locked database or a lost connection is not one.
_DATABASE_STORAGE = re.compile(r"database or disk is full|disk I/O error|attempt to write a readonly database|"
                               r"No space left on device|Read-only file system|Disk quota exceeded")
# A storage fault ends once its folders take a probe write and no write has failed for this long.
CLEAR_AFTER_S = 5.0
# How long a folder's probe result is reused (a probe writes and fsyncs a page).
PROBE_EVERY_S = 2.0


def storage_error(exc: BaseException) -> str | None:
    """``exc`` as a storage fault's words (``ENOSPC (No space left on device) writing in /x``, or
    the database's own first line), or None when it is another error. The database driver's own
    error (SQLAlchemy's ``orig``) and the exceptions ``exc`` was raised from are looked at too: an
    autoflush puts its own words first."""
    seen: set[int] = set()
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        orig = getattr(current, "orig", None)
        chain += [orig, current] if isinstance(orig, BaseException) else [current]
        current = current.__cause__ or current.__context__
    for error in chain:
        fault = storage_fault(error)
        if fault is not None:
            return fault.describe()
        first = (str(error).strip().splitlines() or [""])[0]
        if _DATABASE_STORAGE.search(first):
            return first[:300]
    return None


def is_storage_text(text: str | None) -> bool:
    """Whether an error's words (:func:`storage_error`, a database's message) are a storage fault's."""
    return bool(text) and (_DATABASE_STORAGE.search(text or "") is not None or errno_in(text) in STORAGE_ERRNOS)


@dataclass
class _Open:
    text: str  # the first failure's words
    first_at: float
    last_at: float  # the newest failed write
    fault: StorageFault | None  # the path and errno a probe found, when one did
    failures: dict[str, int] = field(default_factory=dict)  # where -> failed writes
    folders: set[Path] = field(default_factory=set)  # probed before the fault is over
    held: set[tuple[int, int]] = field(default_factory=set)  # (run, attempt) the watchdog held meanwhile


class StorageFaults:
    """The scheduler's storage faults (a full disk, a read-only mount, a database that cannot
    grow), from the first failed write until the storage takes writes again: one log line when a
    fault starts and one when it is over, with the count of failed writes in between; no
    traceback and nothing per tick meanwhile. A write that passes meanwhile does not end it
    (SQLite reuses its WAL's pages: on a full disk some commits pass and some do not); it is over
    once every folder it was seen on takes a probe write and no write has failed for
    CLEAR_AFTER_S.

    The watchdog asks :meth:`problem` before it calls an attempt hung: while its folder or the
    database cannot be written, no progress can be recorded, and that is no hang.

    Args:
        logger: where the two lines go.
        database_folder: the SQLite database's folder (probed when the database fails), or None.
    """

    def __init__(self, logger: logging.Logger, database_folder: Path | None = None):
        self.logger = logger
        self.database_folder = database_folder
        self.clear_after_s = CLEAR_AFTER_S
        self.cleared_at: float | None = None  # when the newest fault was over
        self._open: _Open | None = None
        self._probes: dict[Path, tuple[float, StorageFault | None]] = {}
        self._seen: list[tuple[float, float, StorageFault | None, str]] = []  # (first, last, fault, text)

    @property
    def open(self) -> bool:
        """Whether a storage fault is going on."""
        return self._open is not None

    def failed(self, where: str, exc: BaseException, now: float | None = None) -> bool:
        """``where`` raised ``exc``: True when it is a storage fault (counted here; the first
        one logged in one line), False for any other error (the caller logs it)."""
        text = storage_error(exc)
        if text is None:
            return False
        folder = Path(exc.filename).parent if isinstance(exc, OSError) and exc.filename else self.database_folder
        self._failure(where, text, folder, time.time() if now is None else now)
        return True

    def problem(self, folder: Path, where: str, now: float | None = None) -> str | None:
        """Why ``folder`` (an attempt's) or the database cannot be written now, or None: the
        fault going on, else a probe of the folder (reused for PROBE_EVERY_S), which opens one
        (``where`` names the asker in its line)."""
        now = time.time() if now is None else now
        if self._open is not None:
            self._open.folders.add(folder)
            return self._open.fault.describe() if self._open.fault else self._open.text
        fault = self._probe(folder, now)
        if fault is None:
            return None
        self._failure(where, fault.describe(), folder, now)
        return fault.describe()

    def hold(self, run_id: int, attempt: int) -> bool:
        """Note that the watchdog held this attempt during the fault; True the first time (say so once)."""
        if self._open is None or (run_id, attempt) in self._open.held:
            return False
        self._open.held.add((run_id, attempt))
        return True

    def check(self, now: float | None = None) -> None:
        """Once a tick: end the fault going on when it is over (one line, with the count)."""
        now = time.time() if now is None else now
        fault = self._open
        if fault is None or now - fault.last_at < self.clear_after_s:
            return
        if any(self._probe(folder, now) is not None for folder in fault.folders):
            return
        self._open, self.cleared_at = None, now
        self._seen = [*self._seen[-9:], (fault.first_at, now, fault.fault, fault.text)]
        count = sum(fault.failures.values())
        places = ", ".join(f"{where} {n}" for where, n in sorted(fault.failures.items()))
        self.logger.warning("storage fault over after %.0f s: %s; %d failed write(s) meanwhile (%s)",
                            now - fault.first_at, fault.fault.describe() if fault.fault else fault.text, count, places)

    def seen_since(self, since: float) -> StorageFault | None:
        """The path and errno of a storage fault that went on at or after ``since`` (an attempt's
        start), for an attempt whose end left no evidence; None when there was none (or its errno
        was never found)."""
        if self._open is not None and self._open.fault is not None:
            return self._open.fault
        return next((fault for first, last, fault, _ in reversed(self._seen) if last >= since and fault), None)

    def _failure(self, where: str, text: str, folder: Path | None, now: float) -> None:
        fault = self._open
        if fault is None:
            probed = self._probe(folder, now, fresh=True) if folder is not None else None
            fault = self._open = _Open(text=text, first_at=now, last_at=now, fault=probed)
            self.logger.error("storage fault: %s (first at %s); runyard goes on and counts the failed writes until "
                              "the storage takes writes again", probed.describe() if probed else text, where)
        fault.last_at = now
        fault.failures[where] = fault.failures.get(where, 0) + 1
        if folder is not None:
            fault.folders.add(folder)

    def _probe(self, folder: Path, now: float, fresh: bool = False) -> StorageFault | None:
        cached = self._probes.get(folder)
        if cached is None or fresh or now - cached[0] >= PROBE_EVERY_S:
            cached = self._probes[folder] = (now, writable_problem(folder))
        return cached[1]
