"""The connections a run adds to a PostgreSQL server, read from ``pg_stat_activity`` while a real
2-rank torchrun run trains: rank 0 holds at most one, no other rank and not torchrun's agent hold
any, and none is left once the run has ended (docs/OPERATIONS.md, "PostgreSQL")."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from tests.integration.conftest import Product, running_product

pytestmark = pytest.mark.slow


def client_ports(pg_url: str) -> list[int]:
    """The client-side TCP port of every connection to this test's database."""
    engine = create_engine(pg_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [int(p) for (p,) in conn.execute(text(
                "SELECT client_port FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid() "
                "AND client_port IS NOT NULL"), {"db": make_url(pg_url).database})]
    finally:
        engine.dispose()


def owners(ports: list[int]) -> list[psutil.Process | None]:
    """The local process that holds each client port (``None`` when it closed meanwhile)."""
    by_port = {c.laddr.port: c.pid for c in psutil.net_connections(kind="tcp") if c.laddr and c.pid}
    found: list[psutil.Process | None] = []
    for port in ports:
        try:
            found.append(psutil.Process(by_port[port]) if port in by_port else None)
        except psutil.NoSuchProcess:
            found.append(None)
    return found


def role(proc: psutil.Process | None, product: Product) -> str:
    """Who holds a connection: ``rank N`` (a training rank of this run), ``torchrun`` (a process
    launched for the run that is not a rank), ``scheduler``, or ``other``."""
    if proc is None:
        return "gone"
    try:
        env = proc.environ()
    except psutil.Error:
        return "gone"
    if env.get("RUNYARD_RUN_DIR", "").startswith(str(product.home)):
        return f"rank {env['RANK']}" if "LOCAL_RANK" in env else "torchrun"
    if any(p.pid == proc.pid for p in product.procs):
        return "scheduler"
    return "other"


def test_a_run_holds_at_most_one_connection_from_rank_0_only(tmp_path: Path, pg_url: str) -> None:
    with running_product(tmp_path / "home", pg_url) as product:
        product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.05"  # a few seconds of training to watch, mostly asleep
        run_id = product.submit("train.max_steps=150", "train.log_every=5", "name=connections")
        product.start_scheduler()
        product.wait_step(run_id, 50, timeout=180)
        samples: list[Counter[str]] = []
        while product.query("SELECT status FROM runs WHERE id = :id", id=run_id)[0][0] == "RUNNING" \
                and len(samples) < 40:
            samples.append(Counter(role(p, product) for p in owners(client_ports(pg_url))))
            time.sleep(0.1)
        detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=180)
        assert detail["status"] == "SUCCEEDED", detail["status_reason"]
        after = Counter(role(p, product) for p in owners(client_ports(pg_url)))

    assert len(samples) >= 5, f"the run ended before it could be watched ({len(samples)} samples)"
    for s in samples:
        assert s["rank 0"] <= 1, f"rank 0 held {s['rank 0']} connections: {dict(s)}"
        assert not any(k.startswith("rank ") and k != "rank 0" for k in s), f"another rank connected: {dict(s)}"
        assert s["torchrun"] == 0, f"a non-rank process of the run connected: {dict(s)}"
    assert sum(s["rank 0"] == 1 for s in samples) >= len(samples) // 2, samples  # rank 0 writes through one
    assert not any(k.startswith("rank ") or k == "torchrun" for k in after), f"left after the run: {dict(after)}"
    assert after["scheduler"] <= 5  # its pool (db/engine.py POOL_SIZE + POOL_OVERFLOW)
