"""Several runyard processes started together on a fresh data folder: the scheduler, two
`runyard db upgrade` and two `runyard submit` (and a reader). Before the migration lock one of
them died with a CircularDependencyError or "duplicate column" traceback about half the time;
now the first migrates, the others wait and go on, and the schema is at head once.

Real processes and a real SQLite file. Three fresh folders in a row, because a race that is
lost half the time must be given more than one chance to show itself.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from db.engine import head_revision, make_engine

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits.toml"
ROUNDS = 3
ONE_SLOT = "this machine has only 1 CPU slots"
TIMEOUT_S = 180  # the machine is shared and loaded; each process needs a couple of seconds


def _env(home: Path, slots: int) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RUNYARD_DB_URL", None)
    env["RUNYARD_HOME"] = str(home)
    # The scheduler gets one CPU slot, so the 2-rank runs stay QUEUED: no training is started.
    env["RUNYARD_CPU_SLOTS"] = str(slots)
    return env


def _query(home: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(home / "runyard.db")
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _wait_for_heartbeat(home: Path, scheduler: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        assert scheduler.poll() is None, f"the scheduler exited {scheduler.returncode}: {log.read_text()}"
        try:
            if _query(home, "SELECT count(*) FROM scheduler_heartbeat")[0][0] > 0:
                return
        except sqlite3.OperationalError:  # not migrated yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"no scheduler heartbeat in {TIMEOUT_S} s: {log.read_text()}")


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_processes_started_together_on_a_fresh_home_all_succeed(tmp_path: Path, round_: int) -> None:
    home = tmp_path / "home"  # does not exist yet: every process finds nothing
    runyard = [sys.executable, "-m", "orchestrator"]
    commands = {
        "upgrade-1": ["db", "upgrade"], "upgrade-2": ["db", "upgrade"],
        "submit-1": ["submit", str(EXAMPLE)], "submit-2": ["submit", str(EXAMPLE)],
        "ls": ["ls", "--json"],
    }
    sched_log = tmp_path / "scheduler.log"
    with open(sched_log, "wb") as log:
        scheduler = subprocess.Popen([*runyard, "scheduler"], env=_env(home, 1), stdout=log, stderr=subprocess.STDOUT)
        procs = {name: subprocess.Popen([*runyard, *args], env=_env(home, 2), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True) for name, args in commands.items()}
        try:
            results = {name: (p.wait(TIMEOUT_S), *p.communicate()) for name, p in procs.items()}
            for name, (code, out, err) in results.items():
                assert "Traceback" not in err, f"{name} exited {code}: {out}{err}"
                # A submit that reads the machine after the scheduler published its one slot is
                # refused, as every 2-rank run on that machine is (CI 4 of 2026-12-02): the product's
                # answer, not a fault of the race; one that reads it before is queued.
                refused = name.startswith("submit") and code == 2 and ONE_SLOT in err
                assert code == 0 or refused, f"{name} exited {code}: {out}{err}"
            _wait_for_heartbeat(home, scheduler, sched_log)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
            scheduler.send_signal(signal.SIGTERM)
            try:
                scheduler.wait(30)
            except subprocess.TimeoutExpired:
                scheduler.kill()
    assert "Traceback" not in sched_log.read_text()
    queued = sorted(int(results[n][1]) for n in ("submit-1", "submit-2") if results[n][0] == 0)
    assert queued == list(range(1, len(queued) + 1))  # ids in order, none lost or doubled
    assert _query(home, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
    assert _query(home, "SELECT id, status FROM runs ORDER BY id") == [(i, "QUEUED") for i in queued]


@pytest.mark.parametrize("round_", range(2))  # 3 racers a round; a round is ~30 s of imports under load
def test_three_db_upgrades_on_an_empty_postgres_all_succeed(tmp_path: Path, pg_url: str, round_: int) -> None:
    """Three `runyard db upgrade` started together on an empty PostgreSQL database: the first
    takes the advisory lock and migrates, the others wait, find the work done and go on; the
    schema is at head once, and no password or traceback is printed."""
    env = _env(tmp_path / "home", 2)
    env["RUNYARD_DB_URL"] = pg_url
    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator", "db", "upgrade"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        results = [(p.wait(TIMEOUT_S), *p.communicate()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (code, out, err) in enumerate(results):
        assert code == 0 and "Traceback" not in err, f"upgrade {i} exited {code}: {out}{err}"
        assert out.startswith("database at head: postgresql+psycopg://"), out
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).all() == [(head_revision(),)]
            assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == 0
    finally:
        engine.dispose()
