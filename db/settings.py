"""Where runyard keeps its data: the data folder (``RUNYARD_HOME``, by default one per user in
the platform's user data directory) and the database URL (``RUNYARD_DB_URL``, default a SQLite
file in the data folder).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from db.layout import DB_FILE, RUNS_DIR, SCHEDULER_FILE, SCRAPE_TOKEN_FILE, TOKEN_FILE, run_dir_name

APP_NAME = "runyard"


@dataclass(frozen=True)
class Settings:
    """Locations shared by every runyard process.

    Attributes:
        home: The data folder (runs, logs, checkpoints, the SQLite database).
        db_url: The SQLAlchemy URL of the database.
        home_from_env: Whether ``RUNYARD_HOME`` chose the home (else it is the per-user default).
    """

    home: Path
    db_url: str
    home_from_env: bool = True

    @property
    def runs_dir(self) -> Path:
        return self.home / RUNS_DIR

    def run_dir(self, run_id: int) -> Path:
        return self.runs_dir / run_dir_name(run_id)

    @property
    def token_file(self) -> Path:
        """Where the UI's access token is kept."""
        return self.home / TOKEN_FILE

    @property
    def scrape_token_file(self) -> Path:
        """Where the read-only token of ``GET /metrics`` (Prometheus) is kept."""
        return self.home / SCRAPE_TOKEN_FILE

    @property
    def scheduler_file(self) -> Path:
        """The running scheduler's heartbeat file (db/scheduler_file.py)."""
        return self.home / SCHEDULER_FILE

    @property
    def home_source(self) -> str:
        """How the home was chosen, for messages: ``RUNYARD_HOME`` or ``the default``."""
        return "RUNYARD_HOME" if self.home_from_env else "the default data folder"


def user_data_dir(environ: os._Environ[str] | dict[str, str] | None = None, platform: str | None = None) -> Path:
    """The platform's per-user data directory for runyard (no third-party dependency).

    Linux and other Unixes follow the XDG base directory spec (``$XDG_DATA_HOME/runyard``, else
    ``~/.local/share/runyard``); macOS uses ``~/Library/Application Support/runyard``; Windows
    ``%LOCALAPPDATA%\\runyard``.
    """
    env = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    home = Path(env.get("HOME") or Path.home())
    if platform == "darwin":
        return home / "Library" / "Application Support" / APP_NAME
    if platform.startswith("win"):
        local = env.get("LOCALAPPDATA") or str(home / "AppData" / "Local")
        return Path(local) / APP_NAME
    xdg = env.get("XDG_DATA_HOME", "")
    # The spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".local" / "share"
    return base / APP_NAME


def _absolute(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop or an unreadable parent: db.home says what is wrong
        return Path(os.path.abspath(path))


def load_settings(environ: os._Environ[str] | dict[str, str] | None = None, cwd: Path | None = None) -> Settings:
    """Read the settings from the environment.

    ``RUNYARD_HOME`` (a relative one is resolved against the cwd) overrides the per-user
    default :func:`user_data_dir`. ``RUNYARD_DB_URL`` overrides the database. Nothing is created
    here: whether the home is usable is checked by :mod:`db.home`.
    """
    env = os.environ if environ is None else environ
    raw = env.get("RUNYARD_HOME", "")
    from_env = bool(raw)
    home = Path(raw).expanduser() if from_env else user_data_dir(env)
    home = _absolute(home if home.is_absolute() else (cwd or Path.cwd()) / home)
    url = env.get("RUNYARD_DB_URL") or f"sqlite:///{home / DB_FILE}"
    return Settings(home=home, db_url=url, home_from_env=from_env)
