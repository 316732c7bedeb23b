"""Who may use a folder's paths: the tests that hold runyard's data folder to its owner alone
(tests/unit/db/test_home_private.py, tests/integration/test_private_home.py).
"""

from __future__ import annotations

import stat
from pathlib import Path


def open_to_others(root: Path) -> list[str]:
    """Every path under ``root`` (itself too) that a group or another account may use."""
    found = [] if not root.stat().st_mode & 0o077 else [str(root)]
    for path in root.rglob("*"):
        if not path.is_symlink() and path.lstat().st_mode & 0o077:
            found.append(f"{path} {stat.filemode(path.lstat().st_mode)}")
    return found
