"""Fixtures for the browser tests: the real product (`runyard up`) and a real Chromium.

`runyard_up` starts the scheduler and the UI exactly as a person would, on a free port with
its own RUNYARD_HOME, and on teardown stops them and every training process they left behind.
A test's `page` logs in the way a person does: it opens the URL `runyard up` printed (the token
buys a session cookie, and the UI answers nothing without it).
`page` is a Playwright page in Debian's headless Chromium (Playwright cannot download its own
browser here); the tests skip with a clear message when either is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from db.states import TERMINAL, RunStatus
from tests.cli_runner import run_in_process
from tests.conftest import RUNYARD_UP_MARK, module_shares_a_product, wait_training_gone

STARTUP_TIMEOUT_S = 60.0
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium_binary() -> str | None:
    """Debian's Chromium headless shell (the package ``chromium-headless-shell``, what Playwright
    itself runs for headless pages), else the full browser. The same Blink renders the page; the
    shell has no browser window to composite and took about 20% less CPU over the Run page and
    chart tests (docs/benchmarks-journal.md, "The test suite")."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin"])
    return next((found for name in ("chromium-headless-shell", "chromium", "chromium-browser")
                 if (found := shutil.which(name, path=search))), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runyard_argv() -> list[str]:
    exe = shutil.which("runyard", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "orchestrator"]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> str:
    """Wait until the UI answers its health check; returns the login URL it printed."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"runyard up exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
                printed = re.search(rf"^{re.escape(url)}/\?token=\S+$", log.read_text(), re.MULTILINE)
                if resp.status == 200 and printed:
                    return printed.group(0)
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"runyard up did not answer on {url} in {STARTUP_TIMEOUT_S:.0f} s:\n{log.read_text()[-4000:]}")


def _processes_of(home: Path) -> list[psutil.Process]:
    """Every process whose environment has RUNYARD_HOME == home (scheduler, UI, torchrun, ranks)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("RUNYARD_HOME") == str(home):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _stop(proc: subprocess.Popen, home: Path) -> None:
    """SIGTERM `runyard up` (it stops the scheduler and the UI), then kill what is left:
    its process tree and any training process started for this home."""
    try:
        leftovers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        leftovers = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    leftovers += [p for p in _processes_of(home) if p.pid != os.getpid()]
    for p in leftovers:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(leftovers, timeout=10)


@dataclass(frozen=True)
class Runyard:
    """A running `runyard up`: its URL, its data folder and the login URL it printed."""

    url: str
    home: Path
    login_url: str = ""

    def cli(self, *args: str) -> Any:
        """`runyard ARGS --json` against the same home, in this process (tests/cli_runner.py: a
        `runyard` process would take a second of CPU from the browser and the UI), parsed."""
        env = {**os.environ, "RUNYARD_HOME": str(self.home)}
        env.pop("RUNYARD_DB_URL", None)
        out = run_in_process([*args, "--json"], env)
        assert out.returncode == 0, f"runyard {' '.join(args)} exited {out.returncode}: {out.stderr}"
        return json.loads(out.stdout)


@pytest.fixture
def paced_runs(monkeypatch: pytest.MonkeyPatch) -> float:
    """Listed before ``runyard_up``: every step of its runs' ranks sleeps this long (the test hook
    RUNYARD_FAULT_STEP_DELAY_S, trainer/faults.py). For a test that watches a run go on while a
    person looks: a run of 100,000 steps at full speed kept both cores busy for the test's whole
    length, taken from the Chromium, Streamlit and runs of the test beside it."""
    delay = 0.03
    monkeypatch.setenv("RUNYARD_FAULTS", "1")
    monkeypatch.setenv("RUNYARD_FAULT_STEP_DELAY_S", str(delay))
    return delay


@contextlib.contextmanager
def _runyard_up(folder: Path) -> Iterator[Runyard]:
    """`runyard up` on a free port with RUNYARD_HOME in ``folder``, stopped (with every process it
    started) at the end."""
    home = folder / "home"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "RUNYARD_HOME": str(home), "RUNYARD_CPU_SLOTS": "2"}
    env.pop("RUNYARD_DB_URL", None)
    log = folder / "runyard-up.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*_runyard_argv(), "up", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        login_url = _wait_healthy(url, proc, log)
        yield Runyard(url=url, home=home, login_url=login_url)
    finally:
        _stop(proc, home)
        print(f"\nrunyard up log: {log}")


@pytest.fixture
def runyard_up(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runyard]:
    """The test's own `runyard up` (see :func:`_runyard_up`); in a module that says
    :data:`~tests.conftest.RUNYARD_UP_MARK` on a line of its own, the module's one (:func:`_one_test_of`)."""
    if module_shares_a_product(request.path, (RUNYARD_UP_MARK,)):
        with _one_test_of(request.getfixturevalue("module_runyard_up")) as runyard:
            yield runyard
    else:
        with _runyard_up(tmp_path) as runyard:
            yield runyard


@pytest.fixture(scope="module")
def module_runyard_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runyard]:
    """One `runyard up` for the tests of a module that says :data:`~tests.conftest.RUNYARD_UP_MARK`
    (its tests run on one pytest-xdist worker, one after another)."""
    with _runyard_up(tmp_path_factory.mktemp("shared-up")) as runyard:
        yield runyard


def _run_ids(runyard: Runyard) -> set[int]:
    db = runyard.home / "runyard.db"
    if not db.exists():
        return set()
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as con:
        return {row[0] for row in con.execute("SELECT id FROM runs")}


@contextlib.contextmanager
def _one_test_of(runyard: Runyard) -> Iterator[Runyard]:
    """A module's `runyard up` for one test, which submits and reads its own runs (by their ids:
    the runs of the module's earlier tests are there too). Its runs still queued or running at
    the end are cancelled, and their processes gone, before the next test: it finds the CPU slots
    free."""
    before = _run_ids(runyard)
    yield runyard
    left = _run_ids(runyard) - before
    active = [r["id"] for r in runyard.cli("ls") if r["id"] in left and RunStatus(r["status"]) not in TERMINAL]
    for run_id in active:
        runyard.cli("cancel", str(run_id))
    wait_training_gone(runyard.home, f"runs {active} were cancelled after the test")


def _missing(why: str) -> None:
    """Skip for want of ``why``; fail instead where RUNYARD_TEST_BROWSER_REQUIRED=1 (.ci/run sets
    it: there a missing browser must not pass as skipped tests)."""
    if os.environ.get("RUNYARD_TEST_BROWSER_REQUIRED") == "1":
        pytest.fail(f"RUNYARD_TEST_BROWSER_REQUIRED=1 but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    chromium = chromium_binary()
    if chromium is None:
        _missing("browser tests need Chromium (Debian: apt-get install -y chromium-headless-shell)")
    try:
        from playwright.sync_api import sync_playwright  # noqa: PLC0415 - optional: _missing says how to install Playwright
    except ImportError:
        _missing("browser tests need Playwright (pip install playwright; no browser download needed)")
    with sync_playwright() as pw:
        assert chromium is not None
        b = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh browser page; with `runyard_up` in the test, logged in through the printed URL."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    p.set_default_timeout(30_000)
    if "runyard_up" in request.fixturenames:
        runyard: Runyard = request.getfixturevalue("runyard_up")
        p.goto(runyard.login_url)
        assert "token=" not in p.url, p.url  # the token left the address bar
        assert any(c["name"].startswith("runyard-session-") for c in context.cookies())
    yield p
    context.close()
