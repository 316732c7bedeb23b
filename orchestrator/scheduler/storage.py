"""Storage faults: which errors mean the storage failed (not the training code, not runyard),
whether a folder can be written now, and a run folder deleted under a running run.

A read-only mount (EROFS), a full disk (ENOSPC), a quota (EDQUOT), a size limit (EFBIG) and a
failing device (EIO) pass by themselves or by a person's hand; they are ``DISK`` failures, retried
once the folder is writable and has room again (orchestrator/scheduler/admission.py). A run folder that no
longer exists is neither: its config, logs and checkpoints are gone, and no retry can bring them
back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from dataclasses import dataclass
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


def deleted_message(run_dir: Path) -> str:
    """What to say about a run folder deleted under a running run."""
    return (f"the run folder {run_dir} was deleted while the run was running: its config, logs and checkpoints "
            "are gone; not retried (submit the config again to start over)")
