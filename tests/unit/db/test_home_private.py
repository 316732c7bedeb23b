"""The data folder is its owner's alone (db/home.py; issue 25, item 4): folders 0700, files 0600, an
old home opened to others tightened at the next start with one line. Real folders and real
`runyard` commands in tmp_path; a real run's files are checked in
tests/integration/test_private_home.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from db.home import PRIVATE_UMASK, make_private
from tests.file_modes import open_to_others
from tests.unit.paths import ROOT

EXAMPLE = ROOT / "examples" / "digits.toml"


def runyard(home: Path, *args: str, umask: int = 0o022) -> subprocess.CompletedProcess:
    env = {**os.environ, "RUNYARD_HOME": str(home)}
    env.pop("RUNYARD_DB_URL", None)
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: os.umask(umask), check=True)


@pytest.fixture(autouse=True)
def _keep_umask() -> object:
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


def test_a_fresh_home_is_private_from_its_first_command_under_a_lax_umask(tmp_path: Path) -> None:
    home = tmp_path / "home"
    out = runyard(home, "submit", str(EXAMPLE), umask=0o022)
    assert out.stdout.strip() == "1"
    assert (home / "runyard.db").is_file() and any((home / "runs").iterdir())
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert open_to_others(home) == []
    assert "private" not in out.stderr  # nothing was open to tighten


def test_an_old_home_open_to_others_is_tightened_at_start_with_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    runyard(home, "submit", str(EXAMPLE))
    for path in [home, *home.rglob("*")]:  # as an earlier runyard left it under umask 022
        path.chmod(0o755 if path.is_dir() else 0o644)
    outside = tmp_path / "shared.txt"
    outside.write_text("not runyard's")
    outside.chmod(0o644)
    (home / "link-out").symlink_to(outside)
    assert open_to_others(home)

    out = runyard(home, "ls")
    lines = [line for line in out.stderr.splitlines() if "private" in line]
    assert len(lines) == 1 and str(home) in lines[0], out.stderr
    assert open_to_others(home) == []
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644  # a symlink out of the home is not followed
    assert "private" not in runyard(home, "ls").stderr  # once tight, it says nothing


def test_make_private_sets_the_umask_and_counts_what_it_tightened(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "runs" / "r1").mkdir(parents=True)
    (home / "runs" / "r1" / "log.txt").write_text("x")
    for path in [home, home / "runs", home / "runs" / "r1"]:
        path.chmod(0o755)
    (home / "runs" / "r1" / "log.txt").chmod(0o640)
    assert make_private(home) == 4
    assert os.umask(PRIVATE_UMASK) == PRIVATE_UMASK
    assert stat.S_IMODE((home / "runs" / "r1" / "log.txt").stat().st_mode) == 0o600
    assert make_private(home) == 0
    assert make_private(tmp_path / "missing") == 0
