"""The data folder: the per-user default, the usability check and the
migration lock. Real folders and real SQLite files in tmp_path; tests run as root here, so an
unwritable folder is made with what stops root (a path under a file, /proc, an immutable folder)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from db.engine import (
    MigrationLockTimeout,
    SchemaUnknown,
    ensure_schema,
    head_revision,
    make_engine,
    migration_lock,
    upgrade,
)
from db.home import HomeUnusable, check_folder, check_home
from db.vocabulary.settings import load_settings, user_data_dir
from tests.unit.paths import ROOT

# -- where the home is -----------------------------------------------------------------------


def test_default_home_is_per_user_and_not_the_cwd(tmp_path: Path) -> None:
    env = {"HOME": "/home/ada"}
    assert user_data_dir(env, "linux") == Path("/home/ada/.local/share/runyard")
    assert user_data_dir({**env, "XDG_DATA_HOME": "/data/xdg"}, "linux") == Path("/data/xdg/runyard")
    # The XDG spec: a relative XDG_DATA_HOME is invalid and ignored.
    assert user_data_dir({**env, "XDG_DATA_HOME": "rel"}, "linux") == Path("/home/ada/.local/share/runyard")
    assert user_data_dir(env, "darwin") == Path("/home/ada/Library/Application Support/runyard")
    assert user_data_dir({**env, "LOCALAPPDATA": "C:/Users/ada/AppData/Local"}, "win32").name == "runyard"
    settings = load_settings({"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "xdg")}, cwd=tmp_path / "a")
    assert settings.home == tmp_path / "xdg" / "runyard" and not settings.home_from_env
    assert settings.db_url == f"sqlite:///{tmp_path / 'xdg' / 'runyard' / 'runyard.db'}"


def test_runyard_home_overrides_and_a_relative_one_is_resolved_against_the_cwd(tmp_path: Path) -> None:
    settings = load_settings({"RUNYARD_HOME": "data", "XDG_DATA_HOME": "/nowhere"}, cwd=tmp_path)
    assert settings.home == tmp_path / "data" and settings.home_from_env


# -- is it usable ----------------------------------------------------------------------------


def test_a_file_or_a_path_under_a_file_is_named(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(HomeUnusable, match=f"{afile} .*is a file, not a folder"):
        check_folder(afile, f"data folder {afile}", create=True)
    with pytest.raises(HomeUnusable, match=f"cannot be created: {afile} is a file, not a folder"):
        check_folder(afile / "home", f"data folder {afile / 'home'}", create=True)


def test_a_folder_that_cannot_be_created_is_named(tmp_path: Path) -> None:
    home = Path(f"/proc/runyard-test-{os.getpid()}/home")
    for create in (True, False):
        with pytest.raises(HomeUnusable, match="cannot be created") as info:
            check_folder(home, f"data folder {home}", create=create)
        assert str(home) in str(info.value) and "\n" not in str(info.value)


def test_read_only_commands_create_nothing_and_writing_ones_create_the_home(tmp_path: Path) -> None:
    settings = load_settings({"RUNYARD_HOME": str(tmp_path / "a" / "home")})
    check_home(settings, create=False)
    assert not (tmp_path / "a").exists()
    check_home(settings, create=True)
    assert settings.home.is_dir() and list(settings.home.iterdir()) == []  # the probe file is gone


def test_an_immutable_folder_is_not_writable_even_for_root(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    if subprocess.run(["chattr", "+i", str(home)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    try:
        with pytest.raises(HomeUnusable, match=f"{home} .*is not writable: creating a file in it failed"):
            check_folder(home, f"data folder {home}", create=False)
    finally:
        subprocess.run(["chattr", "-i", str(home)], check=True)


# -- the migration lock ----------------------------------------------------------------------


def test_a_held_migration_lock_makes_others_wait_then_time_out_with_a_sentence(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runyard.db'}"
    with migration_lock(url):
        started = time.monotonic()
        with pytest.raises(MigrationLockTimeout) as info:
            upgrade(url, timeout_s=0.5)
        assert time.monotonic() - started >= 0.5
    message = str(info.value)
    assert str(tmp_path / "migrate.lock") in message and f"pid {os.getpid()}" in message
    upgrade(url)  # released: it goes on
    assert "runs" in inspect(make_engine(url)).get_table_names()


def test_a_waiting_process_goes_on_once_the_migration_is_done(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runyard.db'}"
    engine = make_engine(url)
    result: list[bool] = []
    with migration_lock(url):
        waiter = threading.Thread(target=lambda: result.append(ensure_schema(engine, url)))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # waiting on the lock, not migrating beside the holder
        assert inspect(make_engine(url)).get_table_names() == []
    waiter.join(60)
    assert result == [True]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head_revision()]


def test_ensure_schema_without_create_leaves_an_empty_database_empty(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runyard.db'}"
    engine = make_engine(url)
    assert ensure_schema(engine, url, create=False) is False
    assert inspect(engine).get_table_names() == []


def test_a_database_from_a_newer_runyard_is_named(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runyard.db'}"
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    with pytest.raises(SchemaUnknown, match=r"'9999_future'.*newer runyard"):
        ensure_schema(engine, url)


def test_every_command_names_a_data_folder_made_by_a_pre_release_runyard(tmp_path: Path) -> None:
    """A database at a revision of the pre-release migrations (squashed into the first
    release's) is refused by the commands that read, write and migrate, the scheduler's included,
    with one line saying what made it and what to do, never Alembic's traceback; nothing in the
    folder is changed."""
    home = tmp_path / "home"
    url = f"sqlite:///{home / 'runyard.db'}"
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0009'"))
    env = {**os.environ, "RUNYARD_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("RUNYARD_DB_URL", None)
    expected = (f"error: data folder {home} was made by a pre-release runyard (schema revision 0009_scheduler_leases), "
                "which this runyard cannot read or upgrade: start with a new data folder (set RUNYARD_HOME to an "
                f"empty one), or delete {home / 'runyard.db'} and {home / 'runs'} to start this one afresh")
    for args in (["ls"], ["submit", str(ROOT / "examples" / "digits.toml")], ["db", "upgrade"], ["scheduler"]):
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli.group", *args], capture_output=True, text=True,
                              env=env, timeout=60, check=False)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert done.stderr.strip().splitlines()[-1] == expected, (args, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == ["0009"]
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == 0
    engine.dispose()
