"""Two `runyard scheduler` processes (two data folders, as two nodes would have) on one
PostgreSQL database: every queued run is launched exactly once, by one of them, and succeeds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.integration.conftest import running_product
from tests.pg_local import fresh_database


# -- local fixture, replaced by tests/conftest.py's (branch pgcore) on merge
@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


RUNS = 4


def test_two_schedulers_on_one_postgres_launch_each_run_once(pg_url: str, tmp_path: Path) -> None:
    with running_product(tmp_path / "node-a") as a, running_product(tmp_path / "node-b") as b:
        for p in (a, b):
            p.env["RUNYARD_DB_URL"] = pg_url
        runs = [a.submit("launch.nproc_per_node=1", "train.max_steps=20", f"name=shared-{i}") for i in range(RUNS)]
        a.start_scheduler()
        b.start_scheduler()
        for run_id in runs:
            assert b.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=300)["status"] == "SUCCEEDED"
        assert all(p.poll() is None for p in a.procs + b.procs)  # neither scheduler was refused or died
        engine = create_engine(pg_url)
        try:
            with engine.connect() as conn:
                attempts = conn.execute(text(
                    "SELECT a.run_id, a.number, a.status, h.home FROM attempts a "
                    "JOIN scheduler_heartbeat h ON h.id = a.scheduler_id ORDER BY a.run_id")).all()
                takeovers = conn.execute(text("SELECT message FROM events WHERE kind = 'scheduler'")).all()
                homes = {h for (h,) in conn.execute(text("SELECT home FROM scheduler_heartbeat"))}
        finally:
            engine.dispose()
    # Exactly one attempt per run, each recorded with the scheduler (data folder) that launched it.
    assert [(r, n, s) for r, n, s, _ in attempts] == [(r, 1, "SUCCEEDED") for r in runs]
    assert {h for *_, h in attempts} <= {str(tmp_path / "node-a"), str(tmp_path / "node-b")}
    assert homes == {str(tmp_path / "node-a"), str(tmp_path / "node-b")}  # both held a lease
    assert takeovers == []
    print("launched by:", {h: sum(1 for *_, x in attempts if x == h) for h in homes})
