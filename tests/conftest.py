"""Shared fixtures: a real database upgraded through the real migrations: SQLite in tmp_path, and
PostgreSQL for the tests that run on both (tests/databases.py says how the server is chosen).

Database fixtures:

- ``settings`` / ``sessions``: a migrated database, SQLite unless the test's module is marked
  ``pytestmark = pytest.mark.both_dbs`` (then every test that uses them runs twice, ``[sqlite]``
  and ``[postgres]``).
- ``db_url``: the URL of an EMPTY database (no schema), parametrized ``[sqlite]``/``[postgres]``.
- ``pg_url``: the URL of an EMPTY PostgreSQL database created for this test and dropped after.
- ``db_dialect``: ``"sqlite"`` or ``"postgres"``, the dialect of the case being run.

Slurm: ``slurm`` (tests/slurm_cluster.py), a running test cluster named by ``$RUNYARD_TEST_SLURM``;
skipped without one, failed where ``RUNYARD_TEST_SLURM_REQUIRED=1``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import hypothesis
import psutil
import pytest
from filelock import FileLock
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_sessionmaker, upgrade
from db.vocabulary.settings import Settings
from tests import databases, durations
from tests.databases import CHOICE_ENV, CHOICES, DIALECTS, SERVER_ENV, PostgresUnavailable
from tests.slurm_cluster import slurm  # noqa: F401  (the fixture, registered for every test)

# OpenMP's idle threads spin (libgomp's default) while their rank sleeps between paced steps
# (RUNYARD_FAULT_STEP_DELAY_S) or waits: a one-rank run of 300 such steps took 6.5 s of CPU
# spinning, 3.5 s passive, taken from the tests beside it on two cores. The wait policy changes no
# result (the bit-for-bit tests compare runs of the same thread count); every process a test
# starts inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The property tests (Hypothesis) search afresh on every run: a new input found is a new bug, found
# where a person is looking. CI (.ci/run sets RUNYARD_TEST_DERANDOMIZE=1) tries the same inputs
# every time instead, so that its answer depends on the code alone: a random search once failed
# CI on `workload.workdir = "\x00"`, a bug of the code under test that no change had touched.
hypothesis.settings.register_profile("derandomized", derandomize=True, database=None)
if os.environ.get("RUNYARD_TEST_DERANDOMIZE") == "1":
    hypothesis.settings.load_profile("derandomized")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--db", choices=CHOICES, default=os.environ.get(CHOICE_ENV) or "auto",
        help=f"which databases the both-dialect tests use (default ${CHOICE_ENV} or auto): auto = SQLite, "
             f"and PostgreSQL when ${SERVER_ENV} is set; both/postgres = PostgreSQL required (its cases "
             "fail without a server); sqlite = PostgreSQL cases skipped",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "both_dbs: the module's tests that use `settings`/`sessions` run on SQLite and on PostgreSQL")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test that uses ``db_url``, or uses ``settings`` in a ``both_dbs`` module, once per
    dialect."""
    if "db_dialect" not in metafunc.fixturenames:
        return
    if "db_url" in metafunc.fixturenames or metafunc.definition.get_closest_marker("both_dbs"):
        metafunc.parametrize("db_dialect", DIALECTS, indirect=True)


@pytest.fixture(scope="session")
def pg_server(pytestconfig: pytest.Config) -> str:
    """The PostgreSQL server's URL; skips (only when not asked for) or fails without one."""
    choice = pytestconfig.getoption("--db")
    server = databases.server_url()
    if choice == "sqlite":
        pytest.skip("PostgreSQL case not run: --db=sqlite")
    if server is None:
        if choice in ("both", "postgres"):
            pytest.fail(f"--db={choice} asks for PostgreSQL but ${SERVER_ENV} is not set "
                        "(.ci/run starts a server; or point it at yours)", pytrace=False)
        pytest.skip(f"PostgreSQL case not run: set ${SERVER_ENV} (or --db=both) to run it")
    return server


@pytest.fixture(scope="session")
def pg_template(pg_server: str) -> Iterator[str]:
    """The name of a database migrated to head once per session, which fresh migrated test
    databases copy (CREATE DATABASE ... TEMPLATE is faster than running the migrations)."""
    try:
        url = databases.create_database(pg_server)
    except PostgresUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        upgrade(url)
        yield str(make_url(url).database)
    finally:
        databases.drop_database(pg_server, url)


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL database for this test (dropped after it)."""
    try:
        with databases.fresh_database(pg_server) as url:
            yield url
    except PostgresUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def db_dialect(request: pytest.FixtureRequest) -> str:
    """The dialect of this case: the parameter where the test runs on both, else SQLite."""
    dialect = str(getattr(request, "param", "sqlite"))
    if dialect == "sqlite" and hasattr(request, "param") and request.config.getoption("--db") == "postgres":
        pytest.skip("SQLite case not run: --db=postgres")
    return dialect


@pytest.fixture
def db_url(db_dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The URL of an empty database of this case's dialect (no schema; ``upgrade`` it as needed)."""
    if db_dialect == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'home' / 'runyard.db'}"


SLURM_GROUP = "slurm"
# A module with one of these lines runs its tests on one worker, one after another: they share one
# product started for the module (tests/browser/conftest.py: runyard_up; tests/integration/conftest.py:
# product).
RUNYARD_UP_MARK = "SHARES_ONE_RUNYARD_UP = True"
SCHEDULER_MARK = "SHARES_ONE_SCHEDULER = True"
# ... or a costly module-scoped fixture of its own (tests/integration/test_sharded_checkpoints.py:
# a 4-rank save that every test reads), made once instead of once per worker.
MODULE_FIXTURE_MARK = "SHARES_ITS_MODULE_FIXTURES = True"


@functools.cache
def _marks_of(path: Path) -> frozenset[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return frozenset()
    return frozenset(mark for mark in (RUNYARD_UP_MARK, SCHEDULER_MARK, MODULE_FIXTURE_MARK) if mark in lines)


def module_shares_a_product(path: Path,
                            marks: tuple[str, ...] = (RUNYARD_UP_MARK, SCHEDULER_MARK, MODULE_FIXTURE_MARK)) -> bool:
    """Whether the test module at ``path`` says one of ``marks`` (on a line of its own)."""
    return bool(_marks_of(path) & set(marks))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which a run may go without
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``./dev.sh test`` runs each tier on several workers): the tests of the one
    single-node Slurm cluster (those of a module named ``*slurm*``) run on one worker, one after
    another, since two at once queue each other's jobs behind the node's two CPUs; so do the tests
    of a module that shares one product or a costly module fixture (:func:`module_shares_a_product`);
    every other test is its own unit of work. The group is read from the path: xdist's ``xdist_group`` mark renames
    ``item._nodeid``, which pytest 9 no longer reads."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # noqa: PLC0415 - pytest-xdist's, only under -n

    class SlurmTogether(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            if SLURM_GROUP in module.rsplit("/", 1)[-1]:
                return SLURM_GROUP
            return module if module_shares_a_product(config.rootpath / module) else nodeid

    return SlurmTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The modules whose tests run on one worker, one after another for minutes (the Slurm cluster's,
    # those that share a scheduler), first: one that started last kept one worker busy after the
    # others had run out of tests. The same order on every worker (pytest-xdist checks it).
    # In the browser tier, then, the longest first, by their last measured durations
    # (tests/durations.py): its 70 s test, dispatched 11th of 21, kept one worker busy alone at the
    # end. A module whose tests run together counts as one, at their sum, and keeps its order. (The
    # other tiers keep the collection order: a replay of their durations found no tail to cut.)
    measured = durations.measured()
    totals: dict[Path, float] = {}
    for item in items:
        totals[item.path] = totals.get(item.path, 0.0) + measured.get(item.nodeid, 0.0)

    def seconds(item: pytest.Item) -> float:
        if item.path.parent.name != "browser":
            return 0.0
        return totals[item.path] if module_shares_a_product(item.path) else measured.get(item.nodeid, 0.0)

    items.sort(key=lambda item: (not (SLURM_GROUP in item.path.name
                                      or module_shares_a_product(item.path, (SCHEDULER_MARK,))), -seconds(item)))
    # torch (about 2 s of CPU to import) only where a GPU test was collected: a pytest run of
    # other tests, such as the ones tests/unit runs in a subprocess, does without it.
    gpu_items = [item for item in items if "gpu" in item.keywords]
    has_cuda = False
    if gpu_items:
        try:
            import torch  # noqa: PLC0415 - optional: without torch there is no CUDA to test

            has_cuda = torch.cuda.is_available()
        except ImportError:
            pass
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        if not has_cuda:
            item.add_marker(skip_gpu)
    for item in items:
        if "slurm" in getattr(item, "fixturenames", ()) and SLURM_GROUP not in item.path.name:
            raise pytest.UsageError(f"{item.nodeid} uses the Slurm cluster: put it in a module whose name has "
                                    f"{SLURM_GROUP!r} in it, so it runs after the others of the cluster "
                                    "(pytest_xdist_make_scheduler)")


def wait_until(done: Callable[[], object], timeout: float = 20.0, what: object = "not reached in time") -> None:
    """Poll ``done`` every 20 ms until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def fork_ranks(entry: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """``torch.multiprocessing.start_processes(entry, args, nprocs)`` for tests that play ranks
    themselves (gloo on a file store): the ranks are forked from multiprocessing's fork server,
    which imports ``entry``'s module (and with it torch) once per test process instead of once per
    rank (about 4 s of CPU each when spawned). The server is started by the first call of a
    process with that module preloaded; a later module's ranks import it themselves. The ranks
    get the environment of the process as it was when the server started."""
    import multiprocessing  # noqa: PLC0415 - torch only for the tests that start ranks

    import torch.multiprocessing as mp  # noqa: PLC0415

    multiprocessing.set_forkserver_preload([entry.__module__])
    mp.start_processes(entry, args=args, nprocs=nprocs, start_method="forkserver")


T = TypeVar("T")


def shared_result(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[], T]) -> T:
    """``make()`` once for the whole test session, also under pytest-xdist: the first worker that
    asks makes it (the others wait on a lock) and leaves it as JSON in the session's temp folder,
    which every worker shares. For the reference runs that several tests compare against (a module
    fixture alone would run one per worker). ``make`` returns JSON-safe data (floats round-trip
    exactly)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return json.loads(json.dumps(make()))  # as the workers see it
    root = tmp_path_factory.getbasetemp().parent  # the folder above every worker's own
    path = root / f"shared-{name}.json"
    with FileLock(f"{path}.lock"):
        if path.is_file():
            return json.loads(path.read_text())
        text = json.dumps(make())
        path.write_text(text)
        return json.loads(text)  # what every other worker reads


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to head once per session, which each test's migrated database
    copies (a file copy takes well under a millisecond; the migration about 150 ms). Checkpointed
    and closed, so the whole database is in the one file (WAL mode is kept in its header)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "runyard.db"
    upgrade(f"sqlite:///{path}")
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
    return path


@pytest.fixture
def migrated_url(db_dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a database of this case's dialect at the newest schema (a copy of a template
    migrated once per session, on both dialects)."""
    if db_dialect == "sqlite":
        target = tmp_path / "home" / "runyard.db"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(request.getfixturevalue("sqlite_template"), target)
        yield f"sqlite:///{target}"
        return
    server, template = request.getfixturevalue("pg_server"), request.getfixturevalue("pg_template")
    with databases.fresh_database(server, template=template) as url:
        yield url


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_url: str) -> Settings:
    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("RUNYARD_HOME", str(home))
    monkeypatch.setenv("RUNYARD_DB_URL", migrated_url)
    return Settings(home=home, db_url=migrated_url)


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


def wait_training_gone(home: Path, what: str, timeout_s: float = 60.0) -> None:
    """Wait until no training process of ``home`` is left (:func:`training_processes`); fail
    saying ``what`` was expected to end them otherwise."""
    deadline = time.monotonic() + timeout_s
    while training_processes(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not training_processes(home), f"{what}, and processes of its runs are still there after {timeout_s:.0f} s"


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


@pytest.fixture(autouse=True)
def _umask_restored() -> Iterator[None]:
    """A CLI command run in-process (click's CliRunner) sets runyard's private umask for the whole
    process; restored after each test, so no test sees a umask an earlier one left (a home
    created private or not, and the CLI's "made N paths private" line, depended on test order)."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)
