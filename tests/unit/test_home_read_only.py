"""A data folder that cannot be written (an archived copy, a snapshot, a read-only mount) is still
read: `runyard ls`, `show`, `logs`, `metrics`, `info` and `db export` work on it, and every command that writes
refuses with one line naming the folder.

The folder is made read-only for real: the tests run as root, which ``chmod`` does not stop, so
the home is bind-mounted onto itself and the mount remounted read-only (``mount --bind H H``,
``mount -o remount,ro,bind H``: every write there fails with EROFS, root's too). Where mounting is
not allowed, ``chattr +i`` on the folder stands in (nothing can be created in it, root included);
without either the tests skip and say why. The CLI runs as real ``runyard`` processes, so no open
SQLite handle of the test keeps the mount busy.

    pytest tests/unit/test_home_read_only.py
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.bench_runs_list import seed_runs
from db.engine import make_engine, make_sessionmaker, upgrade

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits.toml"
LOG_LINE = "step 300 loss 0.0123 (the succeeded run's rank 0)"


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[str]:
    """Make ``folder`` read-only for every process, root included; yields how it was done."""
    if _run(["mount", "--bind", str(folder), str(folder)]).returncode == 0:
        try:
            remount = _run(["mount", "-o", "remount,ro,bind", str(folder)])
            if remount.returncode == 0:
                yield "read-only bind mount"
                return
        finally:
            if _run(["umount", str(folder)]).returncode != 0:
                _run(["umount", "-l", str(folder)])
    if _run(["chattr", "+i", str(folder)]).returncode == 0:
        try:
            yield "chattr +i"
        finally:
            _run(["chattr", "-i", str(folder)])
        return
    pytest.skip(f"cannot make {folder} read-only here: neither `mount -o remount,ro,bind` nor `chattr +i` "
                "is allowed to this user")


def _assert_read_only(home: Path) -> None:
    with pytest.raises(OSError):
        (home / "probe").write_text("x")


def runyard(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``runyard ARGS`` as its own process on the data folder ``home``."""
    env = {**os.environ, "RUNYARD_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("RUNYARD_DB_URL", None)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def make_home(home: Path) -> tuple[int, int]:
    """A data folder with a running run (loss points on two ranks) and a succeeded one (a rank 0
    log); returns their ids. The database is closed after, so no ``-wal`` is left."""
    url = f"sqlite:///{home / 'runyard.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as session:
            running, succeeded = seed_runs(session, home / "runs", 2)
            session.commit()
    finally:
        engine.dispose()
    logs = home / "runs" / f"run-{succeeded:06d}" / "attempts" / "1" / "ranks" / "r_x" / "attempt_0" / "0"
    logs.mkdir(parents=True)
    (logs / "stdout.log").write_text(LOG_LINE + "\n")
    return running, succeeded


def test_reads_work_and_writes_refuse_on_a_read_only_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    running, succeeded = make_home(home)
    assert not Path(f"{home / 'runyard.db'}-wal").exists()
    with read_only(home) as how:
        _assert_read_only(home)
        ls = runyard(home, "ls")
        assert ls.returncode == 0, (how, ls.stderr)
        assert "succeeded-1" in ls.stdout and "SUCCEEDED" in ls.stdout and "running-0" in ls.stdout
        assert f"{home} cannot be written; reading it as it is" in ls.stderr
        show = runyard(home, "show", str(succeeded))
        assert show.returncode == 0 and f"run {succeeded}  succeeded-1  SUCCEEDED" in show.stdout, show.stderr
        logs = runyard(home, "logs", str(succeeded))
        assert logs.returncode == 0 and LOG_LINE in logs.stdout, logs.stderr
        metrics = runyard(home, "metrics", str(running))
        assert metrics.returncode == 0 and "1,1,20,loss,0.11" in metrics.stdout, metrics.stderr
        info = runyard(home, "info")
        assert info.returncode == 0 and "schema     0011 (newest 0011)" in info.stdout, info.stderr
        exported = runyard(home, "db", "export", str(tmp_path / "archive.jsonl.gz"))
        assert exported.returncode == 0 and "exported" in exported.stdout, exported.stderr
        for write in (["submit", str(EXAMPLE)], ["cancel", str(running)], ["db", "upgrade"]):
            refused = runyard(home, *write)
            assert refused.returncode == 1, (write, refused.stdout, refused.stderr)
            lines = refused.stderr.strip().splitlines()
            refusal = f"error: data folder {home} (RUNYARD_HOME) is not writable"
            assert len(lines) == 1 and lines[0].startswith(refusal), (write, refused.stderr)
            assert "Read-only file system" in lines[0] or how == "chattr +i"
        assert sorted(p.name for p in home.iterdir()) == ["migrate.lock", "runs", "runyard.db"]  # nothing made
    # The run the refused submit would have queued is not there.
    assert [line.split()[0] for line in runyard(home, "ls").stdout.splitlines()[1:]] == [str(succeeded), str(running)]


def test_a_home_frozen_while_the_database_was_open_is_read_with_its_wal(tmp_path: Path) -> None:
    """A snapshot taken while a scheduler had the database open holds commits only in
    ``runyard.db-wal``: they must be read (``immutable=1`` would silently leave them out)."""
    home = tmp_path / "home"
    home.mkdir()
    make_home(home)
    keeper = sqlite3.connect(home / "runyard.db")  # holds the WAL open: the last commit stays in -wal
    keeper.execute("PRAGMA journal_mode=WAL")
    keeper.execute("PRAGMA wal_autocheckpoint=0")
    keeper.execute("UPDATE runs SET name = 'renamed-after-checkpoint' WHERE id = 1")
    keeper.commit()
    try:
        assert Path(f"{home / 'runyard.db'}-wal").stat().st_size > 0
        with read_only(home) as how:
            ls = runyard(home, "ls")
            assert ls.returncode == 0, (how, ls.stderr)
            assert "renamed-after-check" in ls.stdout, ls.stdout
    finally:
        keeper.close()


def test_an_older_schema_on_a_read_only_home_says_to_upgrade_a_writable_copy(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    upgrade(f"sqlite:///{home / 'runyard.db'}", "0010")
    with read_only(home) as how:
        ls = runyard(home, "ls")
        assert ls.returncode == 1, (how, ls.stdout)
        lines = ls.stderr.strip().splitlines()
        assert lines[-1] == (
            f"error: this read-only database sqlite:///{home / 'runyard.db'} is at revision 0010 (this runyard "
            "reads 0011); upgrade a writable copy: copy the data folder, set RUNYARD_HOME to it and run "
            "`runyard db upgrade`"), ls.stderr
