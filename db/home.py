"""The data folder: whether it can be used.

Every command checks its data folder before it opens the database, so that a folder that is a
file, lies under a file, cannot be created or cannot be written ends in one sentence naming the
folder and what is wrong with it, not in a SQLAlchemy traceback. Writability is checked by
creating a file: ``os.access`` answers yes for root on read-only and immutable folders. The
commands that only read accept an existing folder that cannot be written (an archived copy, a
read-only mount) and open its database read-only (db.engine.make_read_only_engine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path

from db import DatabaseError
from db.engine import sqlite_path
from db.vocabulary.settings import Settings

logger = logging.getLogger(__name__)


class HomeUnusable(DatabaseError):
    """The data folder (or the SQLite database's folder) cannot be used; the message names it
    and says what is wrong with it."""


def _probe(folder: Path) -> OSError | None:
    """Create, write and remove a file in ``folder``; the error when that fails."""
    try:
        fd, name = tempfile.mkstemp(prefix=".runyard-probe-", dir=folder)
    except OSError as exc:
        return exc
    try:
        os.write(fd, b"x")
    except OSError as exc:
        return exc
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)
    return None


def _file_ancestor(path: Path) -> Path | None:
    """The nearest ancestor of ``path`` that exists but is not a folder."""
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            return None if parent.is_dir() else parent
    return None


def _existing_ancestor(path: Path) -> Path:
    for parent in path.parents:
        if parent.is_dir():
            return parent
    return Path(path.anchor or "/")


READ_ONLY_HINT = "`runyard ls`, `show`, `logs`, `metrics`, `info`, `db export` and `ui` (as a viewer) still read it"


def check_folder(folder: Path, what: str, create: bool, write: bool = True) -> bool:
    """Make sure ``folder`` is a folder this process can use, creating it when ``create``.

    Without ``create`` a missing folder is fine as long as it could be created (its nearest
    existing ancestor is writable): read-only commands never create anything.

    Args:
        folder: The folder.
        what: How messages name it, e.g. ``data folder /x (RUNYARD_HOME)``.
        create: Whether to create a missing folder.
        write: Whether the caller must write in it. ``False`` (the commands that only read)
            accepts an existing folder that cannot be written: an archived copy, a read-only
            mount, a snapshot.

    Returns:
        Whether the folder can be written (a missing one: whether it could be created).

    Raises:
        HomeUnusable: naming the folder and what is wrong with it.
    """
    hint = "set RUNYARD_HOME to a folder you can write"
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        blocker = _file_ancestor(folder)
        raise HomeUnusable(
            f"{what} cannot be created: {blocker or 'a parent'} is a file, not a folder; {hint}") from None
    except OSError as exc:
        raise HomeUnusable(f"{what} cannot be used: {exc.strerror or exc}; {hint}") from None
    if st is not None:
        if not os.path.isdir(folder):
            raise HomeUnusable(f"{what} is a file, not a folder; {hint}")
        failure = _probe(folder)
        if failure is None:
            return True
        if not write:
            if not os.access(folder, os.R_OK | os.X_OK):
                raise HomeUnusable(f"{what} cannot be read: permission denied; {hint}")
            logger.debug("%s is read-only (%s): reading it as it is", folder, failure)
            return False
        raise HomeUnusable(f"{what} is not writable: creating a file in it failed: "
                           f"{failure.strerror or failure}; {hint}; {READ_ONLY_HINT}")
    blocker = _file_ancestor(folder)
    if blocker is not None:
        raise HomeUnusable(f"{what} cannot be created: {blocker} is a file, not a folder; {hint}")
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            made = exc.filename or folder
            raise HomeUnusable(
                f"{what} cannot be created: making {made} failed: {exc.strerror or exc}; {hint}") from None
        return check_folder(folder, what, create=False)
    ancestor = _existing_ancestor(folder)
    failure = _probe(ancestor)
    if failure is not None:
        raise HomeUnusable(f"{what} cannot be created: creating anything in {ancestor} failed: "
                           f"{failure.strerror or failure}; {hint}")
    return True


def check_home(settings: Settings, create: bool, write: bool = True) -> bool:
    """Check the data folder and, for a SQLite database elsewhere, the database's folder.

    Args:
        create: Whether to create missing folders.
        write: Whether the caller writes (see :func:`check_folder`); ``False`` accepts a
            read-only home.

    Returns:
        Whether both can be written (always ``True`` when ``write``).

    Raises:
        HomeUnusable: one sentence naming the folder and what is wrong with it.
    """
    source = "RUNYARD_HOME" if settings.home_from_env else "the default; RUNYARD_HOME overrides it"
    writable = check_folder(settings.home, f"data folder {settings.home} ({source})", create, write)
    db_file = sqlite_path(settings.db_url)
    if db_file is not None and db_file.parent != settings.home:
        writable &= check_folder(db_file.parent, f"database folder {db_file.parent} (RUNYARD_DB_URL)", create, write)
    if db_file is not None and db_file.exists() and not db_file.is_file():
        raise HomeUnusable(f"database {db_file} is not a file; remove it or set RUNYARD_DB_URL to another database")
    return writable


def home_writable(settings: Settings) -> bool:
    """Whether the data folder and the SQLite database's folder can both be written."""
    return (not settings.home.is_dir() or _probe(settings.home) is None) and database_writable(settings)


def database_writable(settings: Settings) -> bool:
    """Whether the folder of a SQLite database can be written (SQLite writes its ``-wal``,
    ``-shm`` and journal there, even to read a WAL database); ``True`` for a server database."""
    db_file = sqlite_path(settings.db_url)
    return db_file is None or not db_file.parent.is_dir() or _probe(db_file.parent) is None


# What runyard creates under the data folder is its owner's alone: folders 0700, files 0600. Runs'
# configs, logs, metrics, checkpoints and the database would otherwise be readable by every
# account of a shared workstation (the usual umask 022).
PRIVATE_UMASK = 0o077


def make_private(folder: Path) -> int:
    """Set this process's umask to :data:`PRIVATE_UMASK` (every process it starts inherits it:
    the scheduler's shim, torchrun, the ranks, the UI server) and, when ``folder`` is open to
    others, take the group and other bits off everything of this user's under it.

    Symlinks are not followed, and paths of other owners are left alone. A private folder is not
    walked again, so the check costs one ``stat`` once the home has been tightened.

    Returns:
        How many paths were tightened (0 when the folder was already private or is missing).
    """
    os.umask(PRIVATE_UMASK)
    try:
        if not os.lstat(folder).st_mode & 0o077:
            return 0
    except OSError:
        return 0
    tightened = 0
    uid = os.getuid()
    paths: list[str] = [str(folder)]
    for root, dirs, files in os.walk(folder):  # symlinked folders are listed, not entered
        paths += [os.path.join(root, n) for n in (*dirs, *files)]
    for name in paths:
        try:
            st = os.lstat(name)
            if st.st_uid == uid and not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                os.chmod(name, stat.S_IMODE(st.st_mode) & ~0o077)
                tightened += 1
        except OSError:
            continue
    return tightened


def has_database(settings: Settings) -> bool:
    """Whether a SQLite database file exists (other databases: assumed to, the schema check
    then tells)."""
    db_file = sqlite_path(settings.db_url)
    if db_file is None:
        return True
    try:
        return db_file.stat().st_size > 0
    except OSError:
        return False
