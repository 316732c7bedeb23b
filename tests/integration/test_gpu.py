"""On a CUDA GPU, end to end through the real scheduler: one rank under torchrun with NCCL, bf16
autocast, torch.compile and fused AdamW train gpt-char; CUDA memory metrics and MFU reach the
dashboard's tables, NVML's GPU series are attributed to the run, a checkpoint resumes; fp16
reports its GradScaler's scale; the run's energy is measured by NVML's counter; FSDP with bf16
saves sharded through DCP and resumes. Skipped without a GPU (CI has none); run on a lent GPU
machine, results in BENCHMARKS.md."""

from __future__ import annotations

import json
import math
import sqlite3

import pytest

from tests.integration.conftest import Product
from tests.integration.test_gpt_char import SMALL, curve, succeed

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

ON_ONE_GPU = (*SMALL, "launch.nproc_per_node=1", "launch.backend=auto", "train.batch_size=16", "train.log_every=1",
              "train.lr=0.003", "supervision.startup_timeout_s=900", "retry.max_retries=0")


def gpu_series(product: Product, run_id: int, key: str) -> list[float]:
    con = sqlite3.connect(product.home / "runyard.db")
    try:
        rows = con.execute(
            "SELECT max FROM system_metrics WHERE run_id = ? AND device LIKE 'gpu%' AND key = ?", (run_id, key)
        ).fetchall()
    finally:
        con.close()
    return [v for (v,) in rows]


def test_bf16_compile_on_nccl_reports_cuda_memory_and_resumes(product: Product) -> None:
    run_id = product.submit(*ON_ONE_GPU, "name=gpu-bf16", "train.precision=bf16", "train.compile=true",
                            "train.max_steps=300", "train.eval_every=150", "checkpoint.every_steps=100",
                            "checkpoint.keep_last=0")
    product.start_scheduler()
    detail = succeed(product, run_id, timeout=900)

    logs = product.cli("logs", str(run_id)).stdout
    assert "on cuda:0 (nccl)" in logs and "torch.compile: the whole model" in logs, logs[-2000:]
    metrics = detail["metrics"]
    assert {"mem_allocated_mib", "mem_reserved_mib", "mem_peak_mib"} <= set(metrics)
    assert "mem_rss_mib" not in metrics  # on a GPU the memory that matters is the device's
    assert 0 < metrics["mem_allocated_mib"]["0"] <= metrics["mem_peak_mib"]["0"] <= metrics["mem_reserved_mib"]["0"]
    assert 0 < metrics["mfu"]["0"] < 1  # against the GPU's bf16 peak
    losses = curve(product, run_id)
    assert losses[(0, 300)] < losses[(0, 1)] - 1.0, (losses[(0, 1)], losses[(0, 300)])
    assert all(math.isfinite(v) for v in losses.values())
    assert sorted(c["step"] for c in detail["checkpoints"] if c["verified"] and not c["deleted"]) == [100, 200, 300]

    # NVML's samples of the GPU the run held carry its id (a 10-s window needs the run to last).
    assert gpu_series(product, run_id, "util_percent"), "no GPU utilization attributed to the run"
    assert max(gpu_series(product, run_id, "mem_used_bytes")) > 0

    # Resume from the checkpoint at 100: attempt 2 replays steps 101-300 from it.
    assert product.cli("resume", str(run_id), "--step", "100", "--json").returncode == 0
    resumed = succeed(product, run_id, timeout=900)
    assert resumed["attempts"][-1]["resume_step"] == 100
    again = curve(product, run_id, attempt=2)
    assert min(step for _, step in again) == 101
    # bf16 and compiled kernels are not bitwise reproducible: close, not equal.
    assert abs(again[(0, 300)] - losses[(0, 300)]) < 0.15


def test_fp16_reports_the_grad_scaler_scale(product: Product) -> None:
    run_id = product.submit(*ON_ONE_GPU, "name=gpu-fp16", "train.precision=fp16", "train.max_steps=40",
                            "train.eval_every=0", "checkpoint.every_steps=20")
    product.start_scheduler()
    detail = succeed(product, run_id, timeout=600)
    scales = curve(product, run_id, key="loss_scale")
    assert len(scales) == 40 and all(s >= 1 for s in scales.values())
    assert math.isfinite(detail["metrics"]["loss"]["0"])


def test_the_energy_of_a_run_on_one_gpu_is_read_from_nvmls_counter(product: Product) -> None:
    """Volta and newer (an H100, an H200) have NVML's cumulative energy counter: the run's kWh is
    measured from it, on the GPU the run held alone, at the attempt's start, ticks and end."""
    run_id = product.submit(*ON_ONE_GPU, "name=gpu-energy", "train.max_steps=60", "train.eval_every=0",
                            "checkpoint.every_steps=0")
    product.start_scheduler()
    detail = succeed(product, run_id, timeout=600)
    energy = detail["energy"]
    assert energy["method"] == "measured", energy
    assert energy["source"].startswith("NVML energy counter, GPU "), energy
    assert energy["kwh"] > 0, energy
    assert detail["attempts"][0]["energy"] == energy  # one attempt: the run's is its own


def test_fsdp_bf16_on_nccl_saves_sharded_from_pinned_staging_and_resumes(product: Product) -> None:
    """FSDP2 on NCCL with bf16: the checkpoint is DCP's (each rank's shards staged to pinned CPU
    memory, written on the writer thread over the checkpoint's gloo group while NCCL trains on), and
    a resume from it continues the curve."""
    run_id = product.submit(*ON_ONE_GPU, "name=gpu-fsdp", "parallel.strategy=fsdp", "train.precision=bf16",
                            "train.max_steps=60", "train.eval_every=0", "checkpoint.every_steps=20",
                            "checkpoint.keep_last=0")
    product.start_scheduler()
    detail = succeed(product, run_id, timeout=900)
    assert "on cuda:0 (nccl)" in product.cli("logs", str(run_id)).stdout
    manifest = json.loads((product.home / "runs" / f"run-{run_id:06d}" / "checkpoints" / "step-40" /
                           "manifest.json").read_text())
    assert manifest["format"] == "dcp" and {"__0_0.distcp", ".metadata", "unsharded.pt"} <= set(manifest["files"])
    assert sorted(c["step"] for c in detail["checkpoints"] if c["verified"] and not c["deleted"]) == [20, 40, 60]
    losses = curve(product, run_id)

    assert product.cli("resume", str(run_id), "--step", "20", "--json").returncode == 0
    resumed = succeed(product, run_id, timeout=900)
    assert resumed["attempts"][-1]["resume_step"] == 20
    again = curve(product, run_id, attempt=2)
    assert min(step for _, step in again) == 21
    assert abs(again[(0, 60)] - losses[(0, 60)]) < 0.15  # bf16 on a GPU: close, not bitwise
