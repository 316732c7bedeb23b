"""Two `runyard scheduler` processes (two data folders, as two nodes would have) on one
PostgreSQL database: every queued run is launched exactly once, by one of them, and succeeds."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text

from tests.integration.conftest import running_product


def test_two_schedulers_on_one_postgres_launch_each_run_once(pg_url: str, tmp_path: Path) -> None:
    """B launches the first two runs alone; then A starts beside B's live runs and two more are
    queued for both of them to race for. A must leave B's attempts alone (B's lease is live: no
    take-over) and no run may be launched twice."""
    with running_product(tmp_path / "node-a") as a, running_product(tmp_path / "node-b") as b:
        for p in (a, b):
            p.env["RUNYARD_DB_URL"] = pg_url
        one = ("launch.nproc_per_node=1", "train.max_steps=40")
        first = [b.submit(*one, f"name=first-{i}") for i in range(2)]
        b.start_scheduler()
        for run_id in first:
            b.wait_status(run_id, "STARTING", "RUNNING", "SUCCEEDED", timeout=120)
        a.start_scheduler()
        later = [a.submit(*one, f"name=later-{i}") for i in range(2)]
        for run_id in first + later:
            assert a.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=300)["status"] == "SUCCEEDED"
        assert all(p.poll() is None for p in a.procs + b.procs)  # neither scheduler was refused or died
        # A second scheduler of the same data folder is still refused on PostgreSQL, as on SQLite.
        refused = a.cli("scheduler", check=False)
        assert refused.returncode == 1
        assert f"another scheduler is already running on {tmp_path / 'node-a'}" in refused.stderr
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
    node_a, node_b = str(tmp_path / "node-a"), str(tmp_path / "node-b")
    # Exactly one attempt per run, each recorded with the scheduler (data folder) that launched it.
    assert [(r, n, s) for r, n, s, _ in attempts] == [(r, 1, "SUCCEEDED") for r in first + later]
    assert [h for r, *_, h in attempts if r in first] == [node_b, node_b]
    assert {h for r, *_, h in attempts if r in later} <= {node_a, node_b}
    assert homes == {node_a, node_b}  # both held a lease
    assert takeovers == []
    print("launched by:", {h: sum(1 for *_, x in attempts if x == h) for h in homes})
