"""Scripts on disk and what ``validate`` says of a config that names them, for the tests of what a
UI user may launch (orchestrator/scripts/allowed_roots.py) and of a script run's check at submit.
"""

from __future__ import annotations

import os
from pathlib import Path

from db.vocabulary.config import ConfigError
from db.vocabulary.inventory import Inventory
from orchestrator.scripts.allowed_roots import ScriptRoots
from orchestrator.submission import validate

CPU2 = Inventory(kind="cpu", slots=2)


def script_at(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("print('training')\n")
    return path


def problems_of(data: dict, roots: ScriptRoots | None, base: Path) -> list[str]:
    """The problems ``validate`` reports for ``data`` with ``roots`` (None: the CLI's, none) from
    ``base`` as cwd."""
    cwd = os.getcwd()
    os.chdir(base)  # validate resolves relative paths against the cwd, as the UI process does
    try:
        validate(data, CPU2, roots=roots)
    except ConfigError as exc:
        return exc.problems
    finally:
        os.chdir(cwd)
    return []
