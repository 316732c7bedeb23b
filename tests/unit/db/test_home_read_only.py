"""A data folder that cannot be written (an archived copy, a snapshot, a read-only mount) is still
read: `runyard ls`, `show`, `logs`, `metrics`, `info` and `db export` work on it, and every command that writes
refuses with one line naming the folder.

The folder is made read-only for real: the tests run as root, which ``chmod`` does not stop, so
the home is bind-mounted onto itself and the mount remounted read-only (``mount --bind H H``,
``mount -o remount,ro,bind H``: every write there fails with EROFS, root's too). Where mounting is
not allowed, ``chattr +i`` on the folder stands in (nothing can be created in it, root included);
without either the tests skip and say why. The CLI runs as real ``runyard`` processes, so no open
SQLite handle of the test keeps the mount busy.

    pytest tests/unit/db/test_home_read_only.py
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from bench.bench_runs_list import seed_runs
from db.engine import (
    POOL_SIZE,
    PRE_RELEASE_HEAD,
    head_revision,
    make_engine,
    make_read_only_engine,
    make_sessionmaker,
    read_only_url,
    upgrade,
)
from tests.cli_runner import needs_a_process, run_in_process
from tests.unit.apptest import new_app
from tests.unit.paths import ROOT

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
    with pytest.raises(OSError):  # noqa: PT011 - EROFS or EACCES, as the mount says
        (home / "probe").write_text("x")


def runyard(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``runyard ARGS`` on the data folder ``home``: in this process, as tests/cli_runner.py runs
    it (the mount is read-only for every process), or its own process for a verb that serves."""
    env = {**os.environ, "RUNYARD_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("RUNYARD_DB_URL", None)
    if not needs_a_process(args):
        return run_in_process(args, env)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.group", *args], capture_output=True, text=True,
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
        head = head_revision()
        assert info.returncode == 0 and f"schema     {head} (newest {head})" in info.stdout, info.stderr
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


def _stamp(home: Path, revision: str) -> None:
    """Record ``revision`` as the schema of ``home``'s database, as a pre-release runyard left it."""
    con = sqlite3.connect(home / "runyard.db")
    try:
        con.execute("UPDATE alembic_version SET version_num = ?", (revision,))
        con.commit()
    finally:
        con.close()


def test_a_pre_release_schema_on_a_read_only_home_is_named_with_what_to_do(tmp_path: Path) -> None:
    """A data folder made by a pre-release runyard (its migrations were squashed into the first
    release's) cannot be upgraded, read-only or not: one line names it and what to do. One at the
    pre-release head holds the first release's schema and is read as it is."""
    home = tmp_path / "home"
    home.mkdir()
    make_home(home)
    _stamp(home, "0010")
    with read_only(home) as how:
        ls = runyard(home, "ls")
        assert ls.returncode == 1, (how, ls.stdout)
        lines = ls.stderr.strip().splitlines()
        assert lines[-1] == (
            f"error: data folder {home} was made by a pre-release runyard (schema revision "
            "0010_postgres_metric_keys), which this runyard cannot read or upgrade: start with a new data folder "
            f"(set RUNYARD_HOME to an empty one), or delete {home / 'runyard.db'} and {home / 'runs'} to start "
            "this one afresh"), ls.stderr
        assert "Traceback" not in ls.stderr
    _stamp(home, PRE_RELEASE_HEAD)  # the first release's schema, behind the newest as a first-release folder is
    with read_only(home) as how:
        ls = runyard(home, "ls")
        assert ls.returncode == 1 and "upgrade a writable copy" in ls.stderr, (how, ls.stderr)
        assert f"at revision {PRE_RELEASE_HEAD} (this runyard reads {head_revision()})" in ls.stderr
        info = runyard(home, "info")
        assert info.returncode == 1 and "upgrade a writable copy" in info.stderr, info.stdout


# -- the UI as a viewer ----------------------------------------------------------------------
# Streamlit's AppTest runs app/main.py in this process (its SQLite handles keep the mount busy,
# so the mount is then detached lazily).


def _app(page: str, **query: str) -> AppTest:
    at = new_app().run()
    at.switch_page(page)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def test_the_ui_on_a_read_only_home_shows_everything_and_disables_every_action(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    running, _ = make_home(home)
    monkeypatch.setenv("RUNYARD_HOME", str(home))
    monkeypatch.delenv("RUNYARD_DB_URL", raising=False)
    monkeypatch.setenv("RUNYARD_CPU_SLOTS", "2")
    st.cache_resource.clear()
    st.cache_data.clear()
    try:
        with read_only(home):
            run_page = _app("views/run.py", run=str(running))
            assert not run_page.exception, run_page.exception
            banner = [i.value for i in run_page.info if "Viewing only" in i.value]
            assert banner and f"the data folder {home} cannot be written" in banner[0], [i.value for i in run_page.info]
            assert "running-0" in run_page.markdown[0].value
            shown = {b.key: b for b in run_page.button}
            for action in ("pause_button", "cancel_menu", "stacks_button"):  # what a running run offers
                button = shown[f"viewing-{action}-{running}"]
                assert button.disabled and "cannot be written" in (button.help or ""), action
            assert all(b.disabled for b in run_page.button), [(b.key, b.disabled) for b in run_page.button]
            new_run = _app("views/new_run.py")
            assert not new_run.exception, new_run.exception
            start = [b for b in new_run.button if b.label == "Start"]
            assert start and start[0].disabled
    finally:
        st.cache_resource.clear()
        st.cache_data.clear()


def test_runyard_ui_serves_a_read_only_home_with_its_token_and_refuses_one_without(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    make_home(home)
    with read_only(home) as how:
        refused = runyard(home, "ui", "--port", "1")  # no token file: nothing to open the UI with
        assert refused.returncode == 1, (how, refused.stdout, refused.stderr)
        assert refused.stderr.strip().splitlines() == [
            f"error: data folder {home} is not writable and holds no token file ({home / 'token'}) to open the UI "
            "with; copy the folder somewhere writable and set RUNYARD_HOME to the copy"]
    (home / "token").write_text("t0ken-of-the-archive\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with read_only(home):
        env = {**os.environ, "RUNYARD_HOME": str(home), "PYTHONPATH": str(ROOT)}
        env.pop("RUNYARD_DB_URL", None)
        ui = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.group", "ui", "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stuck = threading.Timer(60, ui.kill)  # a UI that never prints ends the read below, not the suite
        stuck.start()
        try:
            assert ui.stdout is not None
            first = ui.stdout.readline()  # printed once the socket is bound, before serving
            assert first.startswith(f"runyard UI on http://127.0.0.1:{port} (data in {home})"), first
            assert ui.stdout.readline().strip().endswith("t0ken-of-the-archive")  # the archive's own token
            assert ui.poll() is None
        finally:
            stuck.cancel()
            ui.terminate()
            _, err = ui.communicate(timeout=30)
        assert f"runyard: {home} cannot be written; the UI only shows it (every action is disabled)" in err, err
        assert "Traceback" not in err, err
        assert not (home / "ui.json").exists()


def test_runyard_token_prints_a_read_only_homes_token_and_refuses_only_to_make_one(tmp_path: Path) -> None:
    """Issue 52, item 13: the viewer `runyard ui` serves on a read-only home asks for the token,
    so `runyard token` prints the one the folder holds; it refuses to create or replace one."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with read_only(home) as how:
        none = runyard(home, "token")
        assert none.returncode == 1, (how, none.stdout, none.stderr)
        assert none.stderr.strip().splitlines()[-1] == (
            f"error: data folder {home} is not writable and holds no token file ({home / 'token'}); copy the "
            "folder somewhere writable and set RUNYARD_HOME to the copy")
    (home / "token").write_text("t0ken-of-the-archive\n")
    (home / "token").chmod(0o600)
    with read_only(home) as how:
        shown = runyard(home, "token")
        assert shown.returncode == 0, (how, shown.stdout, shown.stderr)
        assert shown.stdout.strip() == "http://127.0.0.1:8501/?token=t0ken-of-the-archive"
        assert f"runyard: {home} cannot be written; this is the token it holds" in shown.stderr
        rotated = runyard(home, "token", "--rotate")
        assert rotated.returncode == 1 and "so its token cannot be replaced" in rotated.stderr, rotated.stderr
        assert runyard(home, "token", "--scrape").returncode == 1  # none to show, none can be made
    assert (home / "token").read_text() == "t0ken-of-the-archive\n"


def test_a_server_database_is_opened_as_usual_by_the_read_only_engine() -> None:
    """A viewer on a read-only home with PostgreSQL: no SQLite pragma may be sent to the server
    (no server runs here: the URL is only parsed, nothing connects)."""

    url = "postgresql+psycopg://u:p@db.example/runyard"
    assert read_only_url(url) == url
    engine = make_read_only_engine(url)
    try:  # make_engine's budgeted pool, not a SQLite engine with its pragma listener
        assert engine.dialect.name == "postgresql" and engine.pool.size() == POOL_SIZE  # type: ignore[attr-defined]
    finally:
        engine.dispose()
