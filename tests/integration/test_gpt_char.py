"""gpt-char end to end through the real scheduler (2 gloo ranks on CPU): it learns the default
corpus well below its unigram entropy; gradient accumulation matches one big batch; FSDP2 gives
DDP's loss curve, and an FSDP run killed with SIGKILL while a sharded save is in flight resumes
from the checkpoint before and continues exactly as the uninterrupted one; a 4-rank FSDP run forks
onto 2 ranks from its shards."""

from __future__ import annotations

import collections
import json
import math
import shutil
import signal
import sqlite3

import pytest

from tests.conftest import training_processes
from tests.integration.conftest import Product
from trainer.workloads.gpt_char import default_corpus_text

pytestmark = pytest.mark.slow

SMALL = (
    "workload.kind=gpt-char",
    "workload.n_layer=2",
    "workload.n_head=4",
    "workload.n_embd=64",
    "workload.block_size=64",
)

PER_RANK_METRICS = {"loss", "lr", "grad_norm", "step_time", "data_wait_s", "compute_s", "tokens_per_s",
                    "samples_per_s", "mfu", "pre_sync_s", "mem_rss_mib"}


def unigram_entropy_nats() -> float:
    """The entropy of the default corpus's character frequencies: what a model that ignores
    context can reach at best."""
    text = default_corpus_text()
    counts = collections.Counter(text)
    return -sum(c / len(text) * math.log(c / len(text)) for c in counts.values())


def curve(product: Product, run_id: int, key: str = "loss", attempt: int | None = None) -> dict[tuple[int, int], float]:
    """(rank, step) -> value of ``key`` for the run (one attempt, or all)."""
    con = sqlite3.connect(product.home / "runyard.db")
    try:
        query = "SELECT rank, step, value FROM metrics WHERE run_id = ? AND key = ?"
        args: tuple = (run_id, key)
        if attempt is not None:
            query += " AND attempt = ?"
            args += (attempt,)
        rows = con.execute(query, args).fetchall()
    finally:
        con.close()
    return {(rank, step): value for rank, step, value in rows}


def succeed(product: Product, run_id: int, timeout: float = 240.0) -> dict:
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", "CANCELLED", timeout=timeout)
    if detail["status"] != "SUCCEEDED":  # what a person would read next: the ranks' last lines
        logs = product.cli("logs", str(run_id), check=False).stdout
        raise AssertionError(f"run {run_id} {detail['status']}: {detail['status_reason']}\n{logs[-6000:]}")
    return detail


def max_diff(a: dict[tuple[int, int], float], b: dict[tuple[int, int], float]) -> float:
    assert a.keys() == b.keys() and a
    return max(abs(a[k] - b[k]) for k in a)


def test_learns_well_below_the_unigram_entropy(product: Product) -> None:
    run_id = product.submit(
        *SMALL, "name=gpt-learns", "train.batch_size=16", "train.max_steps=250", "train.lr=0.003",
        "train.warmup_steps=25", "train.lr_schedule=cosine", "train.min_lr=0.0003", "train.clip_grad_norm=1.0",
        "train.weight_decay=0.1", "train.log_every=25", "train.eval_every=125",
    )
    product.start_scheduler()
    detail = succeed(product, run_id)

    metrics = detail["metrics"]
    for key in PER_RANK_METRICS:
        assert set(metrics[key]) == {"0", "1"}, key
    assert 0 < metrics["mfu"]["0"] < 5  # against a peak measured on this CPU: noisy, but sane
    assert metrics["lr"]["0"] == pytest.approx(0.0003, rel=1e-2)  # the cosine ends at min_lr
    entropy = unigram_entropy_nats()
    eval_loss = metrics["eval_loss"]["0"]
    assert eval_loss < entropy - 0.5, (eval_loss, entropy)
    assert sorted(c["step"] for c in detail["checkpoints"] if not c["deleted"])[-1] == 250


def test_grad_accumulation_matches_one_big_batch(product: Product) -> None:
    common = (*SMALL, "workload.n_embd=32", "workload.block_size=32", "train.max_steps=30", "train.log_every=1",
              "train.eval_every=0", "train.deterministic=true", "train.lr=0.003")
    accum = product.submit(*common, "name=accum", "train.batch_size=16", "train.grad_accum=4")
    big = product.submit(*common, "name=big", "train.batch_size=64", "train.grad_accum=1")
    product.start_scheduler()
    succeed(product, accum)
    succeed(product, big)
    a, b = curve(product, accum), curve(product, big)
    assert len(a) == 2 * 30
    assert max_diff(a, b) < 1e-3


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")
# Inductor compiles the graph in each rank (with two blocks, 110-125 s of the two cores alone on
# 2026-12-02), so under the tier's three workers the suite's 180 s per test is not enough (it timed
# out twice at load 7); a hang still ends here.
@pytest.mark.timeout(420)
def test_compile_matches_eager_under_ddp_with_accumulation_and_activation_checkpointing(product: Product) -> None:
    """``train.compile`` compiles the whole DDP model (gradient accumulation's no_sync and
    activation checkpointing inside the graph): the same loss curve as eager, to float
    rounding.

    Inductor's fused kernels round differently from eager's, and training amplifies the
    difference step by step: on Debian's Python (CI 44) the curves were equal for 5 steps,
    1e-6 apart at step 10, 1e-4 at step 16 and 3.75e-3 at step 22 (a loss near 3), while on
    another interpreter the same 30 steps stayed under 1e-3. What would be a compile bug (a
    gradient not accumulated, a recomputation that differs) moves the loss at step 2 by 0.1 or
    more. So: the first ten steps to 1e-4, all thirty to 2e-2.

    One block (``workload.n_layer=1``): it has every op the compile is on trial for (attention,
    MLP, LayerNorm, the recomputed block, the embeddings and tied head around it), and Inductor's
    work grows with the graph: the test took 70.7-80.2 s of CPU with SMALL's two blocks, 46.5-52.9 s
    with one (the curves 4e-6 apart over thirty steps, 5e-7 over the first ten)."""
    common = (*SMALL, "workload.n_layer=1", "train.batch_size=8", "train.grad_accum=2", "train.max_steps=30",
              "train.log_every=1", "train.eval_every=0", "train.deterministic=true", "train.lr=0.003",
              "supervision.startup_timeout_s=600")
    eager = product.submit(*common, "name=eager")
    compiled = product.submit(*common, "name=compiled", "train.compile=true", "train.activation_checkpointing=true")
    product.start_scheduler()
    succeed(product, eager)
    succeed(product, compiled, timeout=600)
    assert "torch.compile: the whole model" in product.cli("logs", str(compiled)).stdout
    assert "torch.compile" not in product.cli("logs", str(eager)).stdout
    eager_curve, compiled_curve = curve(product, eager), curve(product, compiled)
    assert max_diff(eager_curve, compiled_curve) < 2e-2  # the same steps and ranks, and close
    early = [k for k in eager_curve if k[1] <= 10]
    assert max_diff({k: eager_curve[k] for k in early}, {k: compiled_curve[k] for k in early}) < 1e-4


def test_fsdp_matches_ddp_and_resumes_after_sigkill(product: Product) -> None:
    # Narrower and shorter windows than SMALL's (as the accumulation test's): what is on trial is
    # FSDP's arithmetic and its sharded checkpoints, not what the model learns.
    common = (*SMALL, "workload.n_embd=32", "workload.block_size=32", "train.batch_size=16", "train.max_steps=40",
              "train.log_every=1", "train.eval_every=0", "train.deterministic=true", "train.lr=0.003",
              "train.warmup_steps=5", "train.lr_schedule=cosine", "checkpoint.every_steps=10", "checkpoint.keep_last=0",
              "retry.max_retries=0")
    ddp = product.submit(*common, "name=ddp")
    fsdp = product.submit(*common, "name=fsdp", "parallel.strategy=fsdp")
    product.start_scheduler()
    succeed(product, ddp)
    fsdp_detail = succeed(product, fsdp)
    reference = curve(product, fsdp)
    assert max_diff(curve(product, ddp), reference) < 1e-4

    # Killed while the sharded save of step 20 is in flight (every rank's shards written, rank 0
    # holding the folder before its rename), then resumed by hand: step 20 never
    # existed, the resume starts from 10, the leftover folder is cleaned, the same curve.
    product.procs[-1].send_signal(signal.SIGTERM)
    product.procs[-1].wait(30)
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.3"
    product.env["RUNYARD_FAULT_SAVE_DELAY"] = "20:60"
    killed = product.submit(*common, "name=fsdp-killed", "parallel.strategy=fsdp")
    product.start_scheduler()
    product.wait_step(killed, 24)
    checkpoints = product.home / "runs" / f"run-{killed:06d}" / "checkpoints"
    [in_flight] = [p for p in checkpoints.iterdir() if p.name.startswith(".tmp-step-20-")]
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "unsharded.pt"} <= {p.name for p in in_flight.iterdir()}
    assert not (checkpoints / "step-20").exists()  # written, not yet renamed: it does not count
    for proc in training_processes(product.home):
        proc.send_signal(signal.SIGKILL)
    product.wait_status(killed, "FAILED", timeout=60)
    assert not (checkpoints / "step-20").exists()
    del product.env["RUNYARD_FAULT_SAVE_DELAY"]
    del product.env["RUNYARD_FAULT_STEP_DELAY_S"]  # the resumed attempt at full speed (9 s sooner)
    product.procs[-1].send_signal(signal.SIGTERM)  # a scheduler without the save delay
    product.procs[-1].wait(30)
    product.start_scheduler()
    assert json.loads(product.cli("resume", str(killed), "--json").stdout)["step"] == 10
    detail = succeed(product, killed)
    assert detail["attempts"][-1]["resume_step"] == 10
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".tmp-")]
    resumed = curve(product, killed, attempt=2)
    assert resumed == {k: v for k, v in reference.items() if k[1] > 10}

    def final_digest(d: dict) -> str:
        return next(c["params_digest"] for c in d["checkpoints"] if c["step"] == 40 and not c["deleted"])

    assert final_digest(detail) == final_digest(fsdp_detail)


def test_fsdp_on_four_ranks_saves_shards_and_a_fork_on_two_trains_on_from_them(product: Product) -> None:
    """A 4-rank FSDP run's checkpoints hold each rank's own shard (nothing gathered to rank 0); a
    fork on 2 ranks from a checkpoint with one damaged shard refuses it by name, falls back to the
    one before, loads that resharded, and its loss goes on from where the parent's was, not from a
    fresh model's. (Bit-for-bit resharding of model and optimizer: test_sharded_checkpoints.)"""
    product.env["RUNYARD_CPU_SLOTS"] = "4"  # 4 CPU ranks on a 2-core machine
    common = (*SMALL, "train.batch_size=8", "train.log_every=1", "train.eval_every=0", "train.lr=0.003",
              "train.warmup_steps=5", "checkpoint.keep_last=0", "retry.max_retries=0", "parallel.strategy=fsdp")
    parent = product.submit(*common, "name=fsdp-4", "launch.nproc_per_node=4", "train.max_steps=30",
                            "checkpoint.every_steps=10")
    product.start_scheduler()
    succeed(product, parent)
    checkpoints = product.home / "runs" / f"run-{parent:06d}" / "checkpoints"
    manifest = json.loads((checkpoints / "step-20" / "manifest.json").read_text())
    assert manifest["world_size"] == 4
    assert sorted(name for name in manifest["files"] if name.endswith(".distcp")) == [
        f"__{rank}_0.distcp" for rank in range(4)]
    shard = checkpoints / "step-20" / "__2_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))

    forked = json.loads(product.cli("fork", str(parent), "--step", "20", "--set", "launch.nproc_per_node=2",
                                    "--json").stdout)
    assert "= 32 to 2 x 8 x 1 = 16 samples per step; train.grad_accum = 2 would keep 32" in forked["note"]
    detail = succeed(product, forked["id"])
    assert detail["attempts"][-1]["resume_step"] == 10  # fell back past the damaged shard
    refused = [e["message"] for e in detail["events"] if e["kind"] == "checkpoint_refused"]
    assert refused == ["checkpoint step 20 refused: __2_0.distcp: sha256 mismatch; falling back to an older one"]

    def mean_loss(run_id: int, step: int) -> float:
        values = [v for (_, s), v in curve(product, run_id).items() if s == step]
        return sum(values) / len(values)

    start, before, after = mean_loss(parent, 1), mean_loss(parent, 11), mean_loss(forked["id"], 11)
    assert before < start - 0.3  # the parent learned something worth keeping
    assert abs(after - before) < 0.25 * (start - before), (start, before, after)
