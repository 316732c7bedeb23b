"""Real processes: the `runyard` CLI and scheduler as subprocesses, torchrun with 2 gloo ranks.

``product`` is an installation on SQLite in tmp_path; ``any_product`` the same on the database of
the case (``[sqlite]``/``[postgres]``, tests/databases.py), for the tests that run on both.
Read the database through :meth:`Product.query` (SQLAlchemy), never sqlite3, in those.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.pool import NullPool

from db.home import PRIVATE_UMASK, check_home, make_private
from db.states import TERMINAL, RunStatus
from db.vocabulary.settings import load_settings
from orchestrator.cli.base import open_sessions
from orchestrator.scheduler.resources import detect_inventory
from orchestrator.submission import submit, validate_file
from tests import databases
from tests.cli_runner import needs_a_process, run_in_process
from tests.conftest import SCHEDULER_MARK, module_shares_a_product, shared_result, wait_training_gone

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits.toml"


# What changes when a run's detail does (but what it derives from files and the clock).
RUN_FINGERPRINT = """
SELECT r.status, r.updated_at,
       (SELECT COUNT(*) FROM attempts a WHERE a.run_id = r.id),
       (SELECT MAX(a.last_step) FROM attempts a WHERE a.run_id = r.id),
       (SELECT COUNT(a.ended_at) FROM attempts a WHERE a.run_id = r.id),
       (SELECT COUNT(*) FROM events e WHERE e.run_id = r.id),
       (SELECT COUNT(*) FROM checkpoints c WHERE c.run_id = r.id),
       (SELECT COUNT(*) FROM checkpoints c WHERE c.run_id = r.id AND c.verified),
       (SELECT COUNT(*) FROM checkpoints c WHERE c.run_id = r.id AND c.deleted)
FROM runs r WHERE r.id = :run
"""


@dataclass
class Product:
    """A runyard installation with its data under ``home``."""

    home: Path
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    shared: bool = False  # one installation for a module's tests: its scheduler keeps running between them
    _engine: tuple[str, Any] | None = field(default=None, repr=False)  # (URL, engine) of query()

    @property
    def db_url(self) -> str:
        """The database every process of this installation uses."""
        return self.env.get("RUNYARD_DB_URL") or f"sqlite:///{self.home / 'runyard.db'}"

    def query(self, sql: str, **params: object) -> list[tuple]:
        """Rows of ``sql`` (named ``:params``) on this installation's database, on a connection
        opened for the call and closed after it (no pool: the test holds no connection between
        calls). The engine is kept: a new one set its dialect up again on every poll (``wait_step``
        polls 20 times a second), on PostgreSQL with queries of its own."""
        if self._engine is None or self._engine[0] != self.db_url:
            self._engine = (self.db_url, create_engine(self.db_url, poolclass=NullPool))
        with self._engine[1].connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql), params)]

    def cli(self, *args: str, check: bool = True, process: bool = False) -> subprocess.CompletedProcess:
        """``runyard ARGS`` on this installation: in this process (tests/cli_runner.py: the same
        command, its output and exit code, without a second of CPU for a new interpreter), or as a
        process of its own with ``process`` and for the verbs that serve until stopped."""
        if process or needs_a_process(args):
            result = subprocess.run([sys.executable, "-m", "orchestrator", *args], env=self.env,
                                    capture_output=True, text=True, timeout=120)
        else:
            result = run_in_process(args, self.env)
        if check and result.returncode != 0:
            raise AssertionError(f"runyard {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result

    def show(self, run_id: int) -> dict:
        return json.loads(self.cli("show", str(run_id), "--json").stdout)

    def submit(self, *overrides: str) -> int:
        """Queue examples/digits.toml with ``overrides`` as `runyard submit` does (the same home
        check, private umask, validation and queueing), in this process: a CLI process costs
        0.6 s of CPU, taken from the ranks of the tests beside it on two cores. The real CLI
        submits in :meth:`cli_submit` (test_spine, test_private_home, tests/faults/test_bad_input)."""
        return self.submit_file(EXAMPLE, *overrides)

    def submit_file(self, config_file: Path, *overrides: str) -> int:
        """Queue the run of the TOML file ``config_file`` with ``overrides``, in this process, as
        :meth:`submit` does examples/digits.toml."""
        settings = load_settings(self.env)
        inventory = detect_inventory(self.env)
        umask = os.umask(PRIVATE_UMASK)
        try:
            check_home(settings, create=True)
            make_private(settings.home)
            config = validate_file(config_file, list(overrides), inventory)
            sessions = open_sessions(settings)
            try:
                return submit(sessions, settings, config, inventory)
            finally:
                sessions.kw["bind"].dispose()
        finally:
            os.umask(umask)

    def cli_submit(self, *overrides: str) -> int:
        """`runyard submit examples/digits.toml --set ...`, a `runyard` process as a person runs it."""
        args = ["submit", str(EXAMPLE)]
        for item in overrides:
            args += ["--set", item]
        return int(self.cli(*args, process=True).stdout.strip())

    def start_scheduler(self) -> subprocess.Popen:
        """Start a scheduler; in a module that shares one (:func:`product`), the module's, once."""
        if self.shared and self.procs and self.procs[-1].poll() is None:
            return self.procs[-1]
        log = open(self.home / f"scheduler-{len(self.procs)}.log", "ab")  # noqa: SIM115 - the scheduler's log, open for its life
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "scheduler"], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def detail(self, run_id: int) -> dict:
        """What ``runyard show RUN --json`` prints, read in-process (tests/databases.py)."""
        return databases.run_detail(self.db_url, run_id)

    def wait_for(self, run_id: int, done: Callable[[dict], bool], timeout: float = 180.0) -> dict:
        """Poll :meth:`detail` (``runyard show --json``'s answer, in-process) until ``done``.

        The detail (28 ms of CPU) is read again when the run's rows changed (a 1 ms query of its
        status, attempts, events and checkpoints, every 0.5 s), and every 2 s whatever the rows:
        what it also derives from files and the clock is looked at that often."""
        deadline = time.monotonic() + timeout
        detail: dict = {}
        seen: tuple | None = None
        read_at = -math.inf
        while time.monotonic() < deadline:
            try:
                rows = tuple(self.query(RUN_FINGERPRINT, run=run_id))
                if rows != seen or time.monotonic() - read_at >= 2.0:
                    detail, seen, read_at = self.detail(run_id), rows, time.monotonic()
                    if done(detail):
                        return detail
            except OperationalError as exc:  # SQLite busy past its timeout under load: poll again
                if "locked" not in str(exc):
                    raise
            time.sleep(0.5)
        raise AssertionError(
            f"run {run_id} did not get there in {timeout:.0f} s; last seen: {json.dumps(detail)[:2000]}")

    def wait_step(self, run_id: int, step: int, timeout: float = 120.0) -> int:
        """Poll the database directly (fast) until the newest attempt reports ``step``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                rows = self.query("SELECT last_step FROM attempts WHERE run_id = :run ORDER BY number DESC LIMIT 1",
                                  run=run_id)
            except (OperationalError, ProgrammingError):  # no database or no schema yet
                rows = []
            if rows and rows[0][0] is not None and rows[0][0] >= step:
                return int(rows[0][0])
            time.sleep(0.05)
        raise AssertionError(f"run {run_id} did not reach step {step} in {timeout:.0f} s")

    def wait_status(self, run_id: int, *statuses: str, timeout: float = 180.0) -> dict:
        """Poll the run's status alone (a 1 ms query, every 0.25 s) until it is one of
        ``statuses``; then read and return its detail. :meth:`wait_for` read the whole detail
        whenever a step was reported, about every half second of a run."""
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            try:
                rows = self.query("SELECT status FROM runs WHERE id = :run", run=run_id)
            except OperationalError as exc:  # SQLite busy past its timeout under load: poll again
                if "locked" not in str(exc):
                    raise
                rows = []
            if rows:
                status = rows[0][0]
                if status in statuses:
                    detail = self.detail(run_id)
                    if detail["status"] in statuses:  # not moved on between the two reads
                        return detail
            time.sleep(0.25)
        detail = self.detail(run_id)
        raise AssertionError(f"run {run_id} did not reach {'/'.join(statuses)} in {timeout:.0f} s "
                             f"(it is {status}); last seen: {json.dumps(detail)[:2000]}")


@contextlib.contextmanager
def running_product(home: Path, db_url: str | None = None) -> Iterator[Product]:
    """A runyard installation in ``home`` (on ``db_url``, default its own SQLite file); every
    scheduler it started is stopped on exit."""
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("RUNYARD_DB_URL", None)
    if db_url is not None:
        env["RUNYARD_DB_URL"] = db_url
    env["RUNYARD_HOME"] = str(home)
    env["RUNYARD_CPU_SLOTS"] = env.get("RUNYARD_CPU_SLOTS", "2")
    # A test installation: the fault hooks (trainer/faults.py) work here, and stay inert until a
    # test sets one of the RUNYARD_FAULT_* variables. Real installations never set the switch.
    env["RUNYARD_FAULTS"] = "1"
    # Its own TorchInductor cache: the default (/tmp/torchinductor_<user>) is shared by every test
    # and every session on the machine, and a compile killed half-way (a test's timeout) once left
    # a truncated .so there that failed the next compiled run.
    env["TORCHINDUCTOR_CACHE_DIR"] = str(home / "inductor-cache")
    p = Product(home=home, env=env)
    try:
        yield p
    finally:
        for proc in p.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


@pytest.fixture
def product(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Product]:
    """The test's own installation in tmp_path; in a module that says
    :data:`~tests.conftest.SCHEDULER_MARK` on a line of its own, the module's (:func:`_one_test_of`)."""
    if module_shares_a_product(request.path, (SCHEDULER_MARK,)):
        with _one_test_of(request.getfixturevalue("module_product")) as p:
            yield p
    else:
        with running_product(tmp_path / "home") as p:
            yield p


@pytest.fixture(scope="module")
def module_product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    """One installation, and at most one scheduler at a time, for a module's tests (they run on one
    pytest-xdist worker, one after another)."""
    with running_product(tmp_path_factory.mktemp("shared") / "home") as p:
        p.shared = True
        yield p


@contextlib.contextmanager
def _one_test_of(product: Product) -> Iterator[Product]:
    """The module's installation for one test, which submits and reads its own runs (by id: the
    runs of the module's earlier tests are there too) and leaves the environment as it found it
    (the scheduler would not see a change, and the later tests would). Its runs still queued or
    running at the end are cancelled, and their processes gone, before the next test: it finds
    the scheduler's CPU slots free."""
    def runs() -> dict[int, str]:
        try:
            return {int(row[0]): str(row[1]) for row in product.query("SELECT id, status FROM runs")}
        except (OperationalError, ProgrammingError):  # no database or no schema yet: nothing submitted
            return {}

    before, env = set(runs()), dict(product.env)
    yield product
    assert product.env == env, ("a test changed the environment of the installation its module shares; "
                                "give it a module of its own")
    active = [run_id for run_id, status in runs().items() if run_id not in before and RunStatus(status) not in TERMINAL]
    for run_id in active:
        product.cli("cancel", str(run_id))
    wait_training_gone(product.home, f"runs {active} were cancelled after the test")


@pytest.fixture
def any_product(tmp_path: Path, db_url: str) -> Iterator[Product]:
    """``product`` on the case's database (SQLite or a fresh PostgreSQL database)."""
    with running_product(tmp_path / "home", db_url) as p:
        yield p


# The deterministic 2-rank digits run that the kill-and-resume tests of test_resume.py and
# test_failures.py compare against: a checkpoint every 50 steps, all kept, a loss logged at every step.
DETERMINISTIC_DIGITS = (
    "train.deterministic=true",
    "train.log_every=1",
    "train.max_steps=300",
    "checkpoint.every_steps=50",
    "checkpoint.keep_last=0",
    "retry.max_retries=0",  # the person resumes by hand in test_resume.py; the retries are the test's own settings
)


def losses(product: Product, run_id: int, attempt: int) -> dict[tuple[int, int], float]:
    """(rank, step) -> the loss of one attempt of the run."""
    rows = product.query("SELECT rank, step, value FROM metrics WHERE run_id = :run AND attempt = :attempt "
                         "AND key = 'loss'", run=run_id, attempt=attempt)
    return {(rank, step): value for rank, step, value in rows}


def rank_starts(run_dir: str, attempt: int = 1) -> list[str]:
    """How each rank of the attempt says it started, from its log: "warm" (forked from torchrun's
    agent, trainer/agent/warm.py) or "cold" (a fresh interpreter)."""
    found = []
    for log in sorted(Path(run_dir).glob(f"attempts/{attempt}/ranks/**/stdout.log")):
        said = re.search(r"started (warm|cold)", log.read_text())
        found.append(said.group(1) if said else "?")
    return found


@pytest.fixture(scope="session")
def uninterrupted_digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[tuple[int, int], float]]:
    """The uninterrupted run of :data:`DETERMINISTIC_DIGITS`: its detail (with ``rank_starts``) and
    its losses. Trained once for the session, whichever of test_resume.py and test_failures.py asks
    first (every xdist worker reads the same one): both modules used to train it for themselves."""
    def run() -> tuple[dict, list[tuple[int, int, float]]]:
        with running_product(tmp_path_factory.mktemp("reference") / "home") as product:
            run_id = product.submit(*DETERMINISTIC_DIGITS, "name=reference")
            product.start_scheduler()
            detail = product.wait_status(run_id, "SUCCEEDED", "FAILED")
            assert detail["status"] == "SUCCEEDED", detail["status_reason"]
            detail["rank_starts"] = rank_starts(detail["run_dir"])
            return detail, [(rank, step, value) for (rank, step), value in losses(product, run_id, 1).items()]

    detail, rows = shared_result(tmp_path_factory, "uninterrupted-digits", run)
    return detail, {(rank, step): value for rank, step, value in rows}
