"""The spine end to end: `runyard submit` a 2-rank mlp-digits run, the scheduler launches it
with real torchrun (2 gloo ranks on CPU), and it succeeds with metrics from both ranks (on SQLite
and on PostgreSQL)."""

from __future__ import annotations

import signal

import pytest

from tests.conftest import training_processes
from tests.integration.conftest import Product

pytestmark = pytest.mark.slow


def loss_curve(product: Product, run_id: int, rank: int) -> list[float]:
    rows = product.query("SELECT value FROM metrics WHERE run_id = :run AND key = 'loss' AND rank = :rank "
                         "ORDER BY step", run=run_id, rank=rank)
    return [r[0] for r in rows]


def test_submit_to_succeeded_with_metrics_from_every_rank(any_product: Product) -> None:
    product = any_product
    run_id = product.cli_submit()  # the real CLI, end to end
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", "CANCELLED")
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]

    assert detail["step"] == detail["max_steps"] == 300
    (attempt,) = detail["attempts"]
    assert attempt["status"] == "SUCCEEDED" and attempt["exit_code"] == 0
    assert attempt["started_at"] <= attempt["ended_at"]

    metrics = detail["metrics"]
    assert set(metrics["loss"]) == {"0", "1"}
    assert set(metrics["samples_per_s"]) == {"0", "1"}
    assert metrics["eval_accuracy"]["0"] >= 0.9
    for rank in (0, 1):
        curve = loss_curve(product, run_id, rank)
        assert len(curve) == 30  # every 10 steps
        assert curve[-1] < 0.5 * curve[0]
    assert detail["cost_usd"] > 0
    assert detail["eta_s"] == 0

    history = [h["to"] for h in detail["history"]]
    assert history == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]

    logs = product.cli("logs", str(run_id)).stdout
    assert "[rank 0]" in logs and "[rank 1]" in logs and "eval accuracy" in logs
    rank1 = product.cli("logs", str(run_id), "--rank", "1").stdout
    assert "rank 1/2" in rank1 and "[rank" not in rank1


def test_cancel_stops_every_rank(product: Product) -> None:
    run_id = product.submit("train.max_steps=1000000", "name=endless")
    product.start_scheduler()
    product.wait_status(run_id, "RUNNING", timeout=120)
    out = product.cli("cancel", str(run_id)).stdout
    assert "cancel requested" in out
    detail = product.wait_status(run_id, "CANCELLED", "FAILED", "SUCCEEDED", timeout=60)
    assert detail["status"] == "CANCELLED"
    (attempt,) = detail["attempts"]
    assert attempt["status"] == "CANCELLED"
    # SIGTERM: the ranks finished their step and wrote a last checkpoint before exiting.
    assert attempt["reason"].startswith("cancelled at step") and "with a checkpoint" in attempt["reason"]
    last = attempt["last_checkpoint_step"]
    assert last is not None and last >= attempt["last_step"] - 1
    assert any(c["step"] == last and c["verified"] for c in detail["checkpoints"])
    assert training_processes(product.home) == []  # no rank was left running


def test_scheduler_killed_mid_run_is_readopted(product: Product) -> None:
    # Paced, not long: about 8 s of a run alive across the restart, asleep between steps rather
    # than burning the cores that the other tests' ranks share (1,500 unpaced steps did).
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.025"
    run_id = product.submit("train.max_steps=300", "name=readopt")
    first = product.start_scheduler()
    product.wait_for(run_id, lambda d: d["status"] == "RUNNING" and d["step"] >= 50, timeout=120)
    first.send_signal(signal.SIGKILL)
    first.wait()
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=240)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert len(detail["attempts"]) == 1  # adopted, never launched twice
