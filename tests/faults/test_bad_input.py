"""Bad input and a bad data folder, typed as a user types them: the real `runyard` CLI as a
subprocess. Each case ends in one sentence naming the field or folder and the value, the
documented exit code (1: the folder or the run; 2: the input), no traceback, and nothing queued
or created.

The two large matrices (every command on each kind of unusable folder, every impossible value
at submit: about a hundred cases) run the same click command in the test's process
(tests/cli_runner.py), which answers each in milliseconds where a process took 1.2 s of CPU;
:func:`test_the_matrices_answer_in_process_exactly_as_a_process_does` runs rows of both both
ways and compares exit code, stdout and stderr, and the read-only-mount rows, the serving verbs
and every other test here stay real processes.

Tests run as root here, and a read-only chmod does not stop root, so an unusable folder is made
with what does: a path that is a file or lies under one, a folder under /proc (nothing can be
created there), an immutable folder (chattr +i, skipped where the filesystem has no such flag)
and a read-only bind mount inside a user namespace (unshare -rm, skipped where not allowed).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from db.engine import make_engine, make_sessionmaker
from db.states import RunStatus, transition
from tests.cli_runner import needs_a_process, run_in_process
from tests.integration.conftest import running_product

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits.toml"
TIMEOUT_S = 120  # the machine is shared and loaded; a healthy command takes about a second


@dataclass
class Cli:
    """`runyard` as a person runs it: a cwd, an environment, and argv."""

    env: dict[str, str]
    cwd: Path
    prefix: list[str] = field(default_factory=list)  # e.g. unshare for a read-only mount
    in_process: bool = False  # the command in this process (args must not depend on cwd)

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        if self.in_process and not self.prefix and not needs_a_process(args):
            return run_in_process(args, self.env)
        argv = [*self.prefix, sys.executable, "-m", "orchestrator", *args]
        proc = subprocess.Popen(argv, env=self.env, cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:  # a command that should have refused is serving: stop all of it
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"runyard {' '.join(args)} did not exit in {TIMEOUT_S} s: {out}{err}") from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def make_cli(tmp_path: Path, home: Path | None, cwd: Path | None = None, in_process: bool = False) -> Cli:
    env = dict(os.environ)
    for key in ("RUNYARD_DB_URL", "RUNYARD_HOME"):
        env.pop(key, None)
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    env["RUNYARD_CPU_SLOTS"] = "2"
    if home is not None:
        env["RUNYARD_HOME"] = str(home)
    return Cli(env=env, cwd=cwd or tmp_path, in_process=in_process)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The single `error: ...` line a refusal prints on stderr (and nothing else there)."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def runs_in(home: Path) -> int:
    db = home / "runyard.db"
    if not db.exists():
        return 0
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        con.close()


# -- item 4: an unusable data folder, for every command ---------------------------------------

EVERY_COMMAND = [
    ["submit", str(EXAMPLE)], ["ls"], ["show", "1"], ["logs", "1"], ["cancel", "1"], ["pause", "1"],
    ["resume", "1"], ["fork", "1"], ["pin", "1", "--step", "1"], ["stacks", "1"], ["metrics", "1"],
    ["scheduler"], ["ui"], ["up"], ["token"], ["db", "upgrade"], ["info"],
]


# The commands that only read: they read a home they cannot write instead of refusing it.
READ_COMMANDS = frozenset({"ls", "show", "logs", "metrics", "info"})


@dataclass
class BadHome:
    home: Path
    cli: Cli
    untouched: Path  # the folder that must hold no new file afterwards


def _files(folder: Path) -> set[str]:
    return {str(p) for p in folder.rglob("*")} if folder.is_dir() else set()


@pytest.fixture(params=["a file", "under a file", "under /proc", "immutable", "read-only mount"])
def bad_home(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BadHome]:
    """An unusable data folder of each kind, its CLI answering in this process (but the read-only
    mount's, which runs through unshare)."""
    for made in _bad_home_of(request.param, tmp_path):
        made.cli.in_process = True
        yield made


def _bad_home_of(kind: str, tmp_path: Path) -> Iterator[BadHome]:
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    if kind == "a file":
        yield BadHome(afile, make_cli(tmp_path, afile), tmp_path)
    elif kind == "under a file":
        yield BadHome(afile / "home", make_cli(tmp_path, afile / "home"), tmp_path)
    elif kind == "under /proc":
        home = Path(f"/proc/runyard-test-{uuid.uuid4().hex[:8]}/home")
        yield BadHome(home, make_cli(tmp_path, home), tmp_path)
    elif kind == "immutable":
        home = tmp_path / "immutable"
        home.mkdir()
        if subprocess.run(["chattr", "+i", str(home)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not supported on this filesystem")
        try:
            yield BadHome(home, make_cli(tmp_path, home), home)
        finally:
            subprocess.run(["chattr", "-i", str(home)], check=True)
    else:
        home = tmp_path / "readonly"
        home.mkdir()
        mount = 'd=$1; shift; mount --bind "$d" "$d" && mount -o remount,ro,bind "$d" "$d" && exec "$@"'
        prefix = ["unshare", "-rm", "sh", "-c", mount, "sh", str(home)]
        probe = subprocess.run([*prefix, "sh", "-c", f"! touch {home}/x 2>/dev/null"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"a read-only bind mount in a user namespace is not possible here: {probe.stderr!r}")
        cli = make_cli(tmp_path, home)
        cli.prefix = prefix
        yield BadHome(home, cli, home)


@pytest.mark.parametrize("args", EVERY_COMMAND, ids=lambda a: " ".join(a[:2]).replace(str(EXAMPLE), "CONFIG"))
def test_an_unusable_data_folder_is_one_sentence_and_exit_1_for_every_command(bad_home: BadHome,
                                                                               args: list[str]) -> None:
    before = _files(bad_home.untouched)
    result = bad_home.cli(*args)
    if args[0] in READ_COMMANDS and bad_home.home.is_dir():
        # A folder that exists but cannot be written is still read (an archived copy, a read-only
        # mount: tests/unit/db/test_home_read_only.py); this one has no database yet, and says so.
        assert "Traceback" not in result.stderr and "not writable" not in result.stderr, result.stderr
        if args[0] in ("ls", "info"):
            assert result.returncode == 0, result.stderr
        else:
            assert result.returncode == 1, result.stderr
            home = bad_home.home
            assert result.stderr.splitlines() == [f"runyard: {home} cannot be written; reading it as it is",
                                                  f"error: no run 1: no database yet in {home} (RUNYARD_HOME); "
                                                  "`runyard submit CONFIG.toml` or `runyard up` creates it"]
        assert _files(bad_home.untouched) == before
        return
    line = one_error_line(result)
    assert result.returncode == 1, result.stderr
    assert f"data folder {bad_home.home}" in line
    assert any(what in line for what in ("is a file, not a folder", "cannot be created", "is not writable")), line
    assert _files(bad_home.untouched) == before  # no database, no lock file, nothing


# -- item 5: impossible values are refused at submit -------------------------------------------


@pytest.fixture(scope="module")
def home_with_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bad-input")
    home = tmp / "home"
    assert make_cli(tmp, home)("db", "upgrade").returncode == 0
    return home


def _gpt(*sets: str) -> list[str]:
    return ["--set", 'workload.kind="gpt-char"', *[x for s in sets for x in ("--set", s)]]


def _write(tmp: Path, name: str, content: bytes) -> str:
    path = tmp / name
    path.write_bytes(content)
    return str(path)


def _sparse(tmp: Path, size: int) -> str:
    path = tmp / "huge.txt"
    with open(path, "wb") as f:
        f.truncate(size)  # no disk used
    return str(path)


# id, how to build argv after `submit` (given a scratch folder), what the error must name
SUBMIT_CASES = [
    ("seed 2^32 in the file", lambda t: [_write(t, "c.toml", b"[train]\nseed = 4294967296\n")],
     ["train.seed = 4294967296"]),
    ("seed 2^32 by --set", lambda t: [str(EXAMPLE), "--set", "train.seed=4294967296"], ["train.seed = 4294967296"]),
    ("text missing", lambda t: [str(EXAMPLE), *_gpt(f'workload.text="{t}/missing.txt"')],
     ["workload.text = ", "missing.txt", "no such file"]),
    ("text a directory", lambda t: [str(EXAMPLE), *_gpt(f'workload.text="{t}"')],
     ["workload.text = ", "is a directory"]),
    ("text /dev/zero", lambda t: [str(EXAMPLE), *_gpt('workload.text="/dev/zero"')],
     ["workload.text = '/dev/zero'", "not a regular file"]),
    ("text 300 MiB", lambda t: [str(EXAMPLE), *_gpt(f'workload.text="{_sparse(t, 300 << 20)}"')],
     ["workload.text = ", "huge.txt", "at most 256 MiB"]),
    ("integer past 2^63 by --set", lambda t: [str(EXAMPLE), "--set", "train.max_steps=99999999999999999999"],
     ["train.max_steps = 99999999999999999999"]),
    ("integer past 2^63 in the file", lambda t: [_write(t, "c.toml", b"[train]\nbatch_size = 9223372036854775808\n")],
     ["train.batch_size = 9223372036854775808"]),
    ("non-UTF-8 file", lambda t: [_write(t, "latin1.toml", 'name = "café"\n'.encode("latin-1"))],
     ["latin1.toml", "not UTF-8", "0xe9"]),
    ("config /dev/zero", lambda t: ["/dev/zero"], ["/dev/zero", "not a regular file"]),
    ("config a directory", lambda t: [str(t)], ["cannot read", "a directory"]),
    ("config missing", lambda t: [str(t / "nope.toml")], ["nope.toml", "no such file"]),
    ('deterministic = "yes"', lambda t: [_write(t, "c.toml", b'[train]\ndeterministic = "yes"\n')],
     ["train.deterministic = 'yes'", "true or false"]),
    ("deterministic=yes by --set", lambda t: [str(EXAMPLE), "--set", "train.deterministic=yes"],
     ["train.deterministic = 'yes'"]),
    ("max_steps=1e3", lambda t: [str(EXAMPLE), "--set", "train.max_steps=1e3"],
     ["train.max_steps = 1000.0", "whole number"]),
    ("5,000-digit integer by --set", lambda t: [str(EXAMPLE), "--set", "train.max_steps=" + "9" * 5000],
     ["train.max_steps=99999", "(5000 characters)", "more than 40 digits"]),
    ("array nested 5,000 deep", lambda t: [_write(t, "c.toml", b"[train]\nx = " + b"[" * 5000 + b"]" * 5000)],
     ["x: nested more than 32 deep"]),
    ("table nested 2,000 deep", lambda t: [_write(t, "c.toml", ("[" + ".".join(["t"] * 2000) + "]\nx = 1\n").encode())],
     ["t.t.t.t", "nested more than 32 deep"]),
    ("TOML datetime in the file", lambda t: [_write(t, "c.toml", b"name = 1979-05-27T07:32:00Z\n")],
     ["name = 1979-05-27T07:32:00+00:00", "date/time", "quote it"]),
    ("TOML date by --set", lambda t: [str(EXAMPLE), "--set", "name=1979-05-27"],
     ["--set name = 1979-05-27", "date/time"]),
    ("a model no machine holds", lambda t: [str(EXAMPLE), *_gpt("workload.n_layer=96", "workload.n_embd=16384",
                                                                "workload.n_head=128", "launch.nproc_per_node=1")],
     ["workload.n_embd = 16384", "GiB", "AdamW"]),
]


@pytest.mark.parametrize("case", SUBMIT_CASES, ids=[c[0] for c in SUBMIT_CASES])
def test_an_impossible_value_is_refused_at_submit_with_exit_2_and_nothing_queued(
    home_with_database: Path, tmp_path: Path, case: tuple
) -> None:
    _, argv, expected = case
    result = make_cli(tmp_path, home_with_database, in_process=True)("submit", *argv(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for text in expected:
        assert text in result.stderr, (text, result.stderr)
    assert "nothing was queued" in result.stderr and result.stdout == ""
    assert runs_in(home_with_database) == 0


@pytest.mark.parametrize("row", [0, 2, 9, 15])
def test_the_matrices_answer_in_process_exactly_as_a_process_does(home_with_database: Path, tmp_path: Path,
                                                                   row: int) -> None:
    """The in-process answers of the matrices above are the process's own: rows of each, both
    ways, give the same exit code, stdout and stderr."""
    _, argv, _ = SUBMIT_CASES[row]
    args = ["submit", *argv(tmp_path)]
    a = make_cli(tmp_path, home_with_database)(*args)
    b = make_cli(tmp_path, home_with_database, in_process=True)(*args)
    assert (b.returncode, b.stdout, b.stderr) == (a.returncode, a.stdout, a.stderr), args
    assert a.returncode == 2
    (tmp_path / "afile").write_text("not a folder\n")
    for home in (tmp_path / "afile", tmp_path / "afile" / "home"):
        args = EVERY_COMMAND[row]
        process, in_process = make_cli(tmp_path, home), make_cli(tmp_path, home, in_process=True)
        a, b = process(*args), in_process(*args)
        assert (b.returncode, b.stdout, b.stderr) == (a.returncode, a.stdout, a.stderr), args
    assert runs_in(home_with_database) == 0


def test_the_same_harness_queues_a_good_config(tmp_path: Path) -> None:
    """The refusals above are not the harness failing: a good config goes in."""
    cli = make_cli(tmp_path, tmp_path / "home")
    result = cli("submit", str(EXAMPLE), "--set", "train.seed=4294967295", "--set", "train.max_steps=1000")
    assert result.returncode == 0 and result.stdout.strip() == "1", result.stderr
    assert runs_in(tmp_path / "home") == 1


def test_a_run_id_past_2_63_is_no_such_run(home_with_database: Path, tmp_path: Path) -> None:
    cli = make_cli(tmp_path, home_with_database)
    result = cli("show", "99999999999999999999")
    assert result.returncode == 1
    assert "no run with id 99999999999999999999" in one_error_line(result)
    result = cli("resume", "1", "--step", "99999999999999999999")  # click's own range check: a usage error
    assert result.returncode == 2 and "99999999999999999999" in result.stderr and "Traceback" not in result.stderr


# -- item 7: logs, ls --status and resume say what is wrong -------------------------------------


@pytest.fixture
def queued_and_cancelling(tmp_path: Path) -> tuple[Cli, int, int]:
    """A home with a QUEUED run and a CANCELLING one (moved there through the real state machine:
    launched, then a cancel requested; no scheduler runs, so it stays there)."""
    home = tmp_path / "home"
    cli = make_cli(tmp_path, home)
    queued = int(cli("submit", str(EXAMPLE)).stdout)
    cancelling = int(cli("submit", str(EXAMPLE)).stdout)
    engine = make_engine(f"sqlite:///{home / 'runyard.db'}")
    with make_sessionmaker(engine)() as session:
        assert transition(session, cancelling, RunStatus.STARTING, "test: launched")
        assert transition(session, cancelling, RunStatus.CANCELLING, "test: cancel requested")
        session.commit()
    engine.dispose()
    return cli, queued, cancelling


def test_cli_requests_that_cannot_be_met_say_why(queued_and_cancelling: tuple[Cli, int, int]) -> None:
    cli, queued, cancelling = queued_and_cancelling
    cases = [
        (["logs", str(queued)], 1, [f"run {queued} has no attempts yet", "QUEUED"]),
        (["logs", str(queued), "--rank", "7"], 2, ["--rank 7", "ranks 0 to 1"]),
        (["logs", str(queued), "--attempt", "3"], 1, [f"run {queued} has no attempts yet"]),
        (["ls", "--status", "bogus"], 2, ["'bogus'", "QUEUED, STARTING, RUNNING"]),
        (["resume", str(cancelling)], 1, ["is being stopped (CANCELLING)", "wait until it is PAUSED or CANCELLED"]),
    ]
    for args, code, expected in cases:
        result = cli(*args)
        line = one_error_line(result)
        assert result.returncode == code, (args, result.stderr)
        for text in expected:
            assert text in line, (args, text, line)
    result = cli("ls", "--status", "succeeded")
    assert result.returncode == 0 and "no runs match (status SUCCEEDED)" in result.stdout


@pytest.mark.slow
def test_logs_of_a_finished_run_refuse_a_wrong_rank_or_attempt(tmp_path: Path) -> None:
    """A run that really ran (scheduler, torchrun, 2 gloo ranks): its logs print, and a rank or
    attempt it does not have is refused."""
    with running_product(tmp_path / "home") as product:
        product.start_scheduler()
        run_id = product.submit("train.max_steps=20", "checkpoint.every_steps=0")
        product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=240)
    cli = make_cli(tmp_path, tmp_path / "home")
    good = cli("logs", str(run_id), "--rank", "1")
    assert good.returncode == 0 and good.stdout.strip(), good.stderr
    for args, expected in [(["--attempt", "2"], "--attempt 2: run 1 has attempts 1 to 1"),
                           (["--rank", "2"], "--rank 2: run 1 has ranks 0 to 1")]:
        result = cli("logs", str(run_id), *args)
        assert result.returncode == 2 and expected in one_error_line(result)


# -- item 10: one home per user; read-only verbs create nothing ------------------------------


def test_read_only_commands_on_a_fresh_default_home_create_nothing(tmp_path: Path) -> None:
    cli = make_cli(tmp_path, None)
    home = tmp_path / "xdg" / "runyard"
    result = cli("ls")
    assert result.returncode == 0 and f"no runs yet in {home}" in result.stdout
    assert cli("ls", "--json").stdout.strip() == "[]"
    for args in (["show", "1"], ["logs", "1"], ["metrics", "1"]):
        result = cli(*args)
        assert result.returncode == 1 and f"no database yet in {home}" in one_error_line(result), args
    info = cli("info")
    assert info.returncode == 0 and f"home       {home}" in info.stdout and "schema     none yet" in info.stdout
    assert not (tmp_path / "xdg").exists()


def test_the_default_home_is_the_same_from_every_folder(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert make_cli(tmp_path, None, cwd=tmp_path / "a")("submit", str(EXAMPLE)).returncode == 0
    runs = json.loads(make_cli(tmp_path, None, cwd=tmp_path / "b")("ls", "--json").stdout)
    assert [r["id"] for r in runs] == [1]
    info = json.loads(make_cli(tmp_path, None, cwd=tmp_path / "b")("info", "--json").stdout)
    assert info["home"] == str(tmp_path / "xdg" / "runyard") and info["home_source"] == "default"
    assert info["schema_revision"] == info["schema_head"] is not None
    assert not (tmp_path / "a" / ".runyard").exists() and not (tmp_path / "b" / ".runyard").exists()


def test_a_cpu_slot_count_that_is_not_a_number_is_named(tmp_path: Path) -> None:
    cli = make_cli(tmp_path, tmp_path / "home")
    cli.env["RUNYARD_CPU_SLOTS"] = "two"
    result = cli("submit", str(EXAMPLE))
    assert result.returncode == 1 and "RUNYARD_CPU_SLOTS = 'two'" in one_error_line(result)
    assert runs_in(tmp_path / "home") == 0


def test_a_damaged_database_file_is_one_sentence_naming_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)  # private, as runyard makes it (a home open to others adds a line saying it was tightened)
    (home / "runyard.db").write_bytes(b"this is not SQLite\n" * 400)
    cli = make_cli(tmp_path, home)
    for args in (["ls"], ["submit", str(EXAMPLE)], ["show", "1"]):
        result = cli(*args)
        line = one_error_line(result)
        assert result.returncode == 1 and f"database sqlite:///{home / 'runyard.db'}" in line, args
        assert "file is not a database" in line


def test_a_run_paused_while_queued_is_resumed_from_the_start_by_the_cli(tmp_path: Path) -> None:
    """Issue 25 item 6, through the real CLI (no scheduler runs, so the run stays queued):
    pause holds it, resume queues it again instead of refusing for want of a checkpoint."""
    cli = make_cli(tmp_path, tmp_path / "home")
    assert cli("submit", str(EXAMPLE)).stdout.strip() == "1"
    assert cli("pause", "1").returncode == 0
    result = cli("resume", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "run 1 queued again from the start"
    assert "Traceback" not in result.stderr
