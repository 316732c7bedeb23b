"""Shared fixtures: a real SQLite database in tmp_path, upgraded through the real migrations."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_sessionmaker, upgrade
from db.settings import Settings


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    home = tmp_path / "home"
    url = f"sqlite:///{home / 'runyard.db'}"
    monkeypatch.setenv("RUNYARD_HOME", str(home))
    monkeypatch.setenv("RUNYARD_DB_URL", url)
    upgrade(url)
    return Settings(home=home, db_url=url)


@pytest.fixture
def sessions(settings: Settings) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(settings.db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def training_processes(home: Path) -> list[psutil.Process]:
    """Live processes launched for runs under ``home`` (torchrun, ranks, shim)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            ours = proc.environ().get("RUNYARD_RUN_DIR", "").startswith(str(home))
            if ours and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_processes_of(home: Path) -> int:
    """Kill every process launched for runs under ``home`` (test clean-up)."""
    killed = 0
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        run_dir = env.get("RUNYARD_RUN_DIR", "")
        if run_dir.startswith(str(home)) or env.get("RUNYARD_HOME") == str(home):
            try:
                proc.send_signal(signal.SIGKILL)
                killed += 1
            except psutil.Error:
                pass
    return killed


@pytest.fixture(autouse=True)
def _no_leftover_processes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    yield
    kill_processes_of(tmp_path)


@pytest.fixture(autouse=True)
def _private_user_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that forgets RUNYARD_HOME writes into tmp_path, never into the user's own data
    folder (~/.local/share/runyard, runyard's default home)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
