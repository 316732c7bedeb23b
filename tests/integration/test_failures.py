"""Fault injection with real torchrun ranks on CPU: runyard recovers when recovery makes sense,
stops when it does not, and keeps the evidence (cause, rank, exception, stacks)."""

from __future__ import annotations

import json
import random
import re
import signal
import time
from itertools import pairwise
from pathlib import Path

import psutil
import pytest

from tests.conftest import training_processes
from tests.integration.conftest import Product

pytestmark = pytest.mark.slow

DETERMINISTIC = (
    "train.deterministic=true",
    "train.max_steps=300",
    "checkpoint.every_steps=50",
    "checkpoint.keep_last=0",
    "retry.backoff_s=0.5",
)


def rank_process(product: Product, rank: int) -> psutil.Process:
    for proc in training_processes(product.home):
        try:
            if proc.environ().get("LOCAL_RANK") == str(rank):
                return proc
        except psutil.Error:
            continue
    raise AssertionError(f"rank {rank} is not running")


def assert_every_recovery_phase(detail: dict, killed_at: float) -> None:
    """The attempt after the kill has each phase of its recovery, in order, none negative, and
    together they are the time from the kill to its first step (less the agent's look, at most
    its 0.1 s monitor interval late; 1 s allowed on two busy cores)."""
    retry = detail["attempts"][1]
    phases = retry["phases"]
    assert [p["phase"] for p in phases] == ["teardown", "detect", "relaunch", "launch", "import", "rendezvous",
                                            "data", "checkpoint", "first_step"], phases
    assert all(p["seconds"] >= 0 for p in phases), phases
    # The ranks are forked from torchrun's agent with torch imported (launch.warm_start): importing
    # torch takes time, and it is in the launch phase; the rank's own import phase is short.
    assert phases[3]["seconds"] > 0.2 and phases[4]["seconds"] < phases[3]["seconds"], phases
    took = retry["first_step_at"] - killed_at
    assert 0 <= took - sum(p["seconds"] for p in phases) < 1.0, (took, phases)
    assert detail["attempts"][0]["recovery_s"] == pytest.approx(sum(p["seconds"] for p in phases))


def final_digest(detail: dict) -> str:
    final = [c for c in detail["checkpoints"] if c["step"] == detail["max_steps"] and not c["deleted"]]
    return final[-1]["params_digest"]


@pytest.fixture
def reference_digest(uninterrupted_digits: tuple[dict, dict]) -> str:
    """The final parameters of the uninterrupted run of the same training (tests/integration/conftest.py,
    shared with test_resume.py: it also logs every step and never retries, which changes no parameter)."""
    return final_digest(uninterrupted_digits[0])


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_one_rank_retries_and_ends_identical(product: Product, reference_digest: str, seed: int) -> None:
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.04"
    run_id = product.submit(*DETERMINISTIC, f"name=kill-{seed}")
    product.start_scheduler()
    kill_at = random.Random(seed).randint(60, 240)
    product.wait_step(run_id, kill_at)
    victim = random.Random(seed).choice([0, 1])
    killed_at = time.time()
    rank_process(product, victim).send_signal(signal.SIGKILL)
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=180)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert_every_recovery_phase(detail, killed_at)
    assert "recovery: teardown " in product.cli("show", str(run_id)).stdout
    first = detail["attempts"][0]
    assert first["cause"] == "SIGNAL" and first["failed_rank"] == victim
    assert "SIGKILL" in first["exception"]
    assert first["steps_lost"] == first["last_step"] - first["last_checkpoint_step"]
    assert detail["attempts"][1]["resume_step"] == first["last_checkpoint_step"]
    assert first["recovery_s"] is not None and first["detect_s"] is not None
    assert detail["retries_used"] == 1
    assert final_digest(detail) == reference_digest
    assert 0 < detail["goodput"] < 1
    assert 0 < detail["cost_wasted_usd"] < detail["cost_usd"] == detail["cost_projected_usd"]


def test_sigstop_is_a_hang_with_every_ranks_stack_saved(product: Product) -> None:
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.02"
    run_id = product.submit("train.max_steps=300", "checkpoint.every_steps=50", "supervision.hang_timeout_s=6",
                            "supervision.hang_step_factor=1", "retry.backoff_s=0.5", "name=hang")
    product.start_scheduler()
    product.wait_step(run_id, 120)
    stopped_at = time.time()
    rank_process(product, 1).send_signal(signal.SIGSTOP)
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=180)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    first = detail["attempts"][0]
    assert first["cause"] == "HANG"
    hang = next(e for e in detail["events"] if e["kind"] == "hang" and e["attempt"] == 1)
    assert hang["at"] - stopped_at < 6 + 5  # the timeout, plus the progress flush and one tick
    stacks = Path(first["dir"]) / "stacks"
    for rank in (0, 1):
        text = (stacks / f"rank-{rank}.txt").read_text()
        assert "File " in text and "mlp_digits.py" in text, f"rank {rank}: {text[:500]}"


def test_exception_before_the_first_step_fails_at_once(product: Product) -> None:
    product.env["RUNYARD_FAULT_RAISE"] = "1"
    run_id = product.submit("retry.max_retries=5", "retry.backoff_s=0.5", "launch.nproc_per_node=1", "name=broken")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=120)
    assert detail["status"] == "FAILED"
    (attempt,) = detail["attempts"]
    assert attempt["cause"] == "USER_ERROR"
    # The exception and its place (the innermost frame), which "the same exception twice" compares.
    assert re.fullmatch(r"RuntimeError: injected failure at step 1 \(at faults\.py:\d+ in maybe_raise\)",
                        attempt["exception"]), attempt["exception"]
    assert "before the first step" in detail["status_reason"]
    assert "injected failure" in attempt["log_tail"]


def test_same_exception_at_the_same_step_twice_stops(product: Product) -> None:
    product.env["RUNYARD_FAULT_RAISE"] = "120:1"
    run_id = product.submit("retry.max_retries=5", "retry.backoff_s=0.5", "checkpoint.every_steps=50", "name=twice")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=180)
    assert detail["status"] == "FAILED"
    assert len(detail["attempts"]) == 2  # not all 5 retries
    assert all(a["failed_rank"] == 1 and a["last_step"] == 119 for a in detail["attempts"]), [
        (a["failed_rank"], a["last_step"], a["cause"]) for a in detail["attempts"]]
    assert "same exception at the same step twice" in detail["status_reason"]


def test_crash_loop_stops_after_max_retries_with_backoff(product: Product) -> None:
    product.env["RUNYARD_FAULT_SIGKILL"] = "60:0"  # one rank: the retry policy is on trial, not the ranks
    run_id = product.submit("retry.max_retries=2", "retry.backoff_s=2", "retry.backoff_max_s=60",
                            "checkpoint.every_steps=50", "launch.nproc_per_node=1", "name=loop")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=240)
    assert detail["status"] == "FAILED"
    attempts = detail["attempts"]
    assert len(attempts) == 3 and all(a["cause"] == "SIGNAL" for a in attempts)
    gaps = [b["started_at"] - a["failed_at"] for a, b in pairwise(attempts)]
    assert gaps[0] >= 1.0 and gaps[1] >= 2.0, gaps  # 2 s then 4 s, jitter in [0.5, 1]
    assert "gave up after 2 retries" in detail["status_reason"]


def test_a_rank_that_aborts_in_shutdown_after_finishing_is_not_a_failure(product: Product) -> None:
    # What "terminate called without an active exception" in a C++ destructor does to a rank
    # that already finished: SIGABRT after its metrics and last checkpoint are durable.
    product.env["RUNYARD_FAULT_ABORT_AT_EXIT"] = "1"
    run_id = product.submit("train.max_steps=40", "checkpoint.every_steps=20", "retry.backoff_s=0.5",
                            "name=abort-at-exit")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=120)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    (attempt,) = detail["attempts"]  # nothing was redone
    assert attempt["exit_code"] != 0 and attempt["cause"] is None
    warnings = [e["message"] for e in detail["events"] if e["level"] == "warning"]
    assert any("rank 1 by SIGABRT" in m and "nothing was lost" in m for m in warnings), warnings
    assert max(c["step"] for c in detail["checkpoints"]) == 40


def test_cuda_oom_retries_with_half_the_micro_batch(product: Product) -> None:
    # CI has no GPU: the trainer raises torch.cuda.OutOfMemoryError while the micro-batch is > 32.
    product.env["RUNYARD_FAULT_CUDA_OOM"] = "60:32"
    run_id = product.submit("train.batch_size=64", "checkpoint.every_steps=50", "retry.backoff_s=0.5",
                            "launch.nproc_per_node=1", "name=oom")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=180)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    first, second = detail["attempts"]
    assert first["cause"] == "CUDA_OOM"
    assert second["overrides"] == {"train": {"batch_size": 32, "grad_accum": 2}}
    # The attempt's effective config, written once to its folder, is what its ranks read (the
    # second attempt would have hit the same OOM with the run's 64).
    effective = json.loads((Path(second["dir"]) / "config.json").read_text())["train"]
    assert (effective["batch_size"], effective["grad_accum"]) == (32, 2)
    assert json.loads((Path(first["dir"]) / "config.json").read_text())["train"]["batch_size"] == 64
    assert second["resume_step"] == 50
    assert detail["metrics"]["eval_accuracy"]["0"] >= 0.9


def test_sigterm_from_outside_checkpoints_and_does_not_spend_a_retry(product: Product) -> None:
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.03"
    run_id = product.submit("checkpoint.every_steps=100", "retry.max_retries=0", "name=preempted")
    product.start_scheduler()
    product.wait_step(run_id, 130)
    for proc in training_processes(product.home):  # the spot instance is going away: everyone gets SIGTERM
        try:
            if "orchestrator.executors.shim" not in " ".join(proc.cmdline()):
                proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=180)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]  # with max_retries = 0
    first = detail["attempts"][0]
    assert first["cause"] == "PREEMPTED" and first["retry_counted"] is False
    assert detail["retries_used"] == 0
    stop_step = first["last_checkpoint_step"]
    assert stop_step not in (None, 100) and stop_step >= 130  # a checkpoint written at the stop
    assert detail["attempts"][1]["resume_step"] == stop_step
    assert first["steps_lost"] == 0


def test_scheduler_sigkill_during_two_runs(product: Product) -> None:
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.02"
    # One rank each, on the two CPU slots: the re-adoption of two runs is on trial (test_spine
    # re-adopts a 2-rank run).
    a = product.submit("name=one", "launch.nproc_per_node=1")
    b = product.submit("name=two", "launch.nproc_per_node=1")
    first = product.start_scheduler()
    product.wait_step(a, 50)
    product.wait_step(b, 50)
    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(2)  # training goes on without a scheduler
    product.start_scheduler()
    for run_id in (a, b):
        detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=180)
        assert detail["status"] == "SUCCEEDED", detail["status_reason"]
        assert len(detail["attempts"]) == 1  # re-adopted, launched once
