"""`runyard db export` / `runyard db import`: a SQLite data set of real runs (2-rank torchrun,
metrics, checkpoints, a failed attempt) moved into a fresh PostgreSQL, and from there into a
fresh SQLite again, reads the same through `runyard show --json`, field for field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.integration.conftest import Product, running_product


def test_export_from_sqlite_import_into_postgres_and_back_gives_equal_runs(
        product: Product, pg_url: str, tmp_path: Path) -> None:
    # Rank 1 is killed before step 30 in every attempt: the 20-step run never gets there.
    product.env["RUNYARD_FAULT_SIGKILL"] = "30:1"
    good = product.submit("train.max_steps=20", "train.log_every=2", "checkpoint.every_steps=10", "name=good")
    bad = product.submit("train.max_steps=60", "train.log_every=2", "checkpoint.every_steps=10",
                         "retry.max_retries=0", "name=killed")
    product.start_scheduler()
    assert product.wait_status(good, "SUCCEEDED", "FAILED", timeout=240)["status"] == "SUCCEEDED"
    assert product.wait_status(bad, "SUCCEEDED", "FAILED", timeout=240)["status"] == "FAILED"
    for proc in product.procs:  # the data set is still while it moves
        proc.terminate()
        proc.wait(30)
    runs = [good, bad]
    before = {r: product.show(r) for r in runs}
    assert before[good]["checkpoints"] and before[bad]["attempts"][0]["status"] == "FAILED"

    exported = tmp_path / "export.jsonl.gz"
    result = product.cli("db", "export", str(exported))
    assert f"to {exported}" in result.stdout and "exported metric_points:" in result.stderr
    with gzip.open(exported, "rt") as src:
        header = json.loads(src.readline())
    assert header["format"] == "runyard-export" and "alembic_version" not in header["tables"]

    for label, db_url in (("postgres", pg_url), ("sqlite", None)):
        with running_product(tmp_path / f"home-{label}") as target:  # no scheduler: only the CLI
            if db_url is not None:
                target.env["RUNYARD_DB_URL"] = db_url
            result = target.cli("db", "import", str(exported))
            assert "imported metric_points:" in result.stderr, result.stderr
            after = {r: target.show(r) for r in runs}
            # Every field, the volatile ones (times, durations, costs) included: nothing is excluded.
            assert after == before, label
            again = target.cli("db", "import", str(exported), check=False)
            assert again.returncode != 0 and "is not empty" in again.stderr and "nothing was imported" in again.stderr
            # New rows after an import take new ids (PostgreSQL's sequences were moved past the ids).
            assert target.submit("train.max_steps=5", "name=after-import") == max(runs) + 1
