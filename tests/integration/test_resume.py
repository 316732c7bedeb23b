"""Resume equivalence: a deterministic 2-rank run killed with SIGKILL (every process of the
attempt: torchrun, both ranks and the launcher) and resumed from its newest verified checkpoint
continues exactly as the uninterrupted run: the per-step losses after the resume point and the
final params_digest are bit-identical.

Kill points: mid-epoch between two checkpoints, and while a checkpoint is being written (the
writer is held before publishing it by a fault-injection hook, so the in-flight save must not
count and the resume must fall back to the previous one). Plus corruption: a truncated file, a
flipped byte and a missing manifest are each refused with an event, and the resume falls back.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.conftest import training_processes
from tests.integration.conftest import DETERMINISTIC_DIGITS, Product, losses, rank_starts

pytestmark = pytest.mark.slow

SETTINGS = DETERMINISTIC_DIGITS


def final_digest(detail: dict) -> str:
    finals = [c for c in detail["checkpoints"] if c["step"] == detail["max_steps"] and not c["deleted"]]
    return finals[-1]["params_digest"]


@pytest.fixture
def reference(uninterrupted_digits: tuple[dict, dict]) -> tuple[dict, dict]:
    """The uninterrupted run (tests/integration/conftest.py: shared with test_failures.py)."""
    return uninterrupted_digits


def kill_attempt(product: Product) -> None:
    """SIGKILL every process of the run at once, as a host losing the job would."""
    procs = training_processes(product.home)
    assert procs, "nothing to kill"
    for proc in procs:
        proc.send_signal(signal.SIGKILL)


def resume_and_compare(product: Product, run_id: int, reference: tuple[dict, dict], expect_resume_step: int) -> dict:
    ref_detail, ref_losses = reference
    product.wait_status(run_id, "FAILED", timeout=60)
    out = json.loads(product.cli("resume", str(run_id), "--json").stdout)
    assert out["step"] == expect_resume_step
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=180)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    second = detail["attempts"][-1]
    assert second["number"] == 2 and second["resume_step"] == expect_resume_step

    resumed = losses(product, run_id, 2)
    expected = {k: v for k, v in ref_losses.items() if k[1] > expect_resume_step}
    assert len(expected) == 2 * (300 - expect_resume_step)
    assert resumed == expected  # bit-identical, every rank, every step after the resume point
    assert final_digest(detail) == final_digest(ref_detail)
    return detail


def test_sigkill_mid_epoch_then_resume_is_bit_identical(any_product: Product, reference: tuple[dict, dict]) -> None:
    """On SQLite and on PostgreSQL (the reference run is on SQLite: the losses read back from
    PostgreSQL must equal it bit for bit)."""
    product = any_product
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.05"
    run_id = product.submit(*SETTINGS, "name=killed")
    product.start_scheduler()
    # Between the checkpoints at 100 and 150, mid-epoch (11 batches per epoch per rank).
    product.wait_step(run_id, 118)
    kill_attempt(product)
    killed_at = product.show(run_id)["attempts"][0]["last_step"]
    assert 118 <= killed_at < 150, killed_at  # not a checkpoint step
    assert 100 % 11 != 0  # the resume point is mid-epoch (11 batches per epoch per rank)
    resume_and_compare(product, run_id, reference, expect_resume_step=100)


def test_ranks_started_cold_train_bit_for_bit_as_the_warm_ones(product: Product, reference: tuple[dict, dict]) -> None:
    """The reference run's ranks were forked from torchrun's agent with torch imported (the
    default, ``launch.warm_start``); the same run with every rank a fresh interpreter trains to
    the same losses on every rank and step, and the same parameters, bit for bit."""
    ref_detail, ref_losses = reference
    assert ref_detail["rank_starts"] == ["warm", "warm"]
    run_id = product.submit(*SETTINGS, "launch.warm_start=false", "name=cold")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED")
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert rank_starts(detail["run_dir"]) == ["cold", "cold"]
    assert losses(product, run_id, 1) == ref_losses
    assert final_digest(detail) == final_digest(ref_detail)


def test_sigkill_during_an_in_flight_save(product: Product, reference: tuple[dict, dict]) -> None:
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.05"
    product.env["RUNYARD_FAULT_SAVE_DELAY"] = "150:60"  # the writer holds step 150 before publishing
    run_id = product.submit(*SETTINGS, "name=killed-saving")
    product.start_scheduler()
    product.wait_step(run_id, 160)
    ckpt_dir = Path(product.show(run_id)["run_dir"]) / "checkpoints"
    assert any(p.name.startswith(".tmp-step-150") for p in ckpt_dir.iterdir()), "the save of step 150 is not in flight"
    kill_attempt(product)
    assert not (ckpt_dir / "step-150").exists()
    product.env.pop("RUNYARD_FAULT_SAVE_DELAY")
    product.env.pop("RUNYARD_FAULT_STEP_DELAY_S")  # the resumed attempt at full speed (200 steps, 10 s sooner)
    product.procs[-1].send_signal(signal.SIGTERM)  # restart the scheduler without the save delay
    product.procs[-1].wait(30)
    product.start_scheduler()
    detail = resume_and_compare(product, run_id, reference, expect_resume_step=100)
    assert [c["step"] for c in detail["checkpoints"] if c["attempt"] == 1] == [50, 100]


@pytest.mark.parametrize("damage", ["truncate", "flip-byte", "delete-manifest"])
def test_damaged_checkpoint_is_refused_and_resume_falls_back(product: Product, damage: str) -> None:
    # One rank: the verification of rank 0's files is on trial (the kills above use two).
    run_id = product.submit("train.max_steps=200", "checkpoint.every_steps=50", "checkpoint.keep_last=0",
                            "launch.nproc_per_node=1", f"name={damage}")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED")
    assert detail["status"] == "SUCCEEDED"
    step_dir = Path(product.show(run_id)["run_dir"]) / "checkpoints" / "step-150"
    state = step_dir / "state.pt"
    if damage == "truncate":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    elif damage == "flip-byte":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0x01
        state.write_bytes(bytes(data))
    else:
        (step_dir / "manifest.json").unlink()

    assert json.loads(product.cli("resume", str(run_id), "--step", "150", "--json").stdout)["step"] == 150
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=120)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert detail["attempts"][-1]["resume_step"] == 100  # fell back past the damaged one
    refused = [e for e in detail["events"] if e["kind"] == "checkpoint_refused"]
    assert refused and "step 150" in refused[0]["message"]
    expected_reason = {"truncate": "size", "flip-byte": "sha256", "delete-manifest": "manifest"}[damage]
    assert expected_reason in refused[0]["message"]
    row = next(c for c in detail["checkpoints"] if c["step"] == 150 and c["attempt"] == 1)
    assert row["verified"] is False and row["refused_reason"]


def test_two_local_nodes_retry_a_killed_rank_bit_for_bit(product: Product, reference: tuple[dict, dict]) -> None:
    """``launch.nnodes = 2`` with one rank each: two torchrun agents on this machine (one per
    node, the rendezvous on loopback) form the same 2-rank world as the reference run (one node,
    two ranks). A rank killed on node 1 ends the attempt on both nodes, the retry resumes from
    the newest checkpoint, and every loss after it and the final parameters equal the reference's
    bit for bit. (Two physical nodes cannot be had here: the same command lines run on one host.)"""
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.05"
    run_id = product.submit(*SETTINGS, "launch.nnodes=2", "launch.nproc_per_node=1", "retry.max_retries=1",
                            "retry.backoff_s=0", "name=two-nodes")
    product.start_scheduler()
    product.wait_step(run_id, 118)
    ranks = {p.environ().get("RANK"): p for p in training_processes(product.home) if "LOCAL_RANK" in p.environ()}
    assert set(ranks) == {"0", "1"}, ranks
    assert ranks["0"].environ()["GROUP_RANK"] != ranks["1"].environ()["GROUP_RANK"]  # one rank on each node
    # The reference's ranks have one thread each (two ranks on two cores); so must these, whose
    # nodes have one rank each (torchrun would leave them every core, and other arithmetic).
    assert [p.environ()["OMP_NUM_THREADS"] for p in ranks.values()] == ["1", "1"]
    ranks["1"].send_signal(signal.SIGKILL)
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=240)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    first, second = detail["attempts"]
    assert (first["cause"], first["failed_rank"]) == ("SIGNAL", 1), first
    assert 118 <= first["last_step"] < 150 and second["resume_step"] == 100
    ref_detail, ref_losses = reference
    # The two layouts agree before the kill too: a failure here is the layout's arithmetic, not the
    # resume's. (It failed so in CI under load while these ranks had two threads each and the
    # reference's one: orchestrator/executors/launcher.py's rank_env now gives both layouts the same.)
    before = {k: v for k, v in losses(product, run_id, 1).items() if k[1] <= 100}
    differ = sorted((k for k, v in before.items() if ref_losses.get(k) != v), key=lambda k: k[1])
    assert not differ, f"{len(differ)} of {len(before)} losses before the kill differ from the reference: {differ[:4]}"
    expected = {k: v for k, v in ref_losses.items() if k[1] > 100}
    assert losses(product, run_id, 2) == expected  # bit-identical, both ranks, every step after the resume
    assert final_digest(detail) == final_digest(ref_detail)
    # Each node's ranks log in a folder of their own; `runyard logs` finds rank 1 on node 1.
    attempt_dir = Path(second["dir"])
    assert sorted(p.name for p in (attempt_dir / "ranks").iterdir()) == ["node-0", "node-1"]
    assert "rank 1/2" in product.cli("logs", str(run_id), "--rank", "1").stdout
