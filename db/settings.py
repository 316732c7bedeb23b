"""Where runyard keeps its data: ``RUNYARD_HOME`` (default ``./.runyard``) and the database URL
(``RUNYARD_DB_URL``, default a SQLite file under the home)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    """Locations shared by every runyard process."""

    home: Path
    db_url: str

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    def run_dir(self, run_id: int) -> Path:
        return self.runs_dir / f"run-{run_id:06d}"


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    """Read the settings from the environment; relative paths are resolved against the cwd."""
    env = os.environ if environ is None else environ
    home = Path(env.get("RUNYARD_HOME") or ".runyard").expanduser().resolve()
    url = env.get("RUNYARD_DB_URL") or f"sqlite:///{home / 'runyard.db'}"
    return Settings(home=home, db_url=url)
