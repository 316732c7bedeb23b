"""The ``slurm`` fixture: skipped with a reason where no cluster is named, failed where one is
required (``RUNYARD_TEST_SLURM_REQUIRED=1``, as CI sets it) but missing; never silently passed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    case = tmp_path / "test_slurm_case.py"  # a Slurm test lives in a module named *slurm* (tests/conftest.py)
    case.write_text("def test_x(slurm):\n    assert slurm\n")
    base = {k: v for k, v in os.environ.items()
            if k not in ("RUNYARD_TEST_SLURM", "RUNYARD_TEST_SLURM_REQUIRED", "SLURM_CONF")}
    base.update(PYTHONPATH=str(ROOT), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **env)
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "tests.conftest",
            "--rootdir", str(tmp_path), str(case)]
    return subprocess.run(argv, env=base, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_slurm_missing_skips_with_a_reason_or_fails_where_required(tmp_path: Path) -> None:
    skipped = _pytest(tmp_path)
    assert skipped.returncode == 0, skipped.stdout
    assert "1 skipped" in skipped.stdout and "Slurm test not run: $RUNYARD_TEST_SLURM is not set" in skipped.stdout

    required = _pytest(tmp_path, RUNYARD_TEST_SLURM_REQUIRED="1")
    assert required.returncode == 1, required.stdout
    assert "RUNYARD_TEST_SLURM_REQUIRED=1 asks for Slurm but $RUNYARD_TEST_SLURM is not set" in required.stdout

    nowhere = _pytest(tmp_path, RUNYARD_TEST_SLURM_REQUIRED="1", RUNYARD_TEST_SLURM=str(tmp_path / "none.conf"))
    assert nowhere.returncode == 1 and "none.conf: no such file" in nowhere.stdout, nowhere.stdout
