"""trainer/techniques.py: the learning-rate schedule, clipping, autocast, the optimizer choice,
deterministic kernels, and the CPU peak a run measures once and its retries read.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from db.vocabulary.config import TrainConfig
from tests.unit.paths import ROOT
from trainer import techniques

CPU = torch.device("cpu")


def tc(**kw: object) -> TrainConfig:
    return TrainConfig(**kw)  # type: ignore[arg-type]


def test_constant_lr_without_warmup_is_lr_everywhere() -> None:
    cfg = tc(lr=0.001)
    assert {techniques.lr_at(s, cfg) for s in (0, 1, 150, 299, 1000)} == {0.001}


def test_warmup_is_linear_then_cosine_reaches_min_lr_at_max_steps() -> None:
    cfg = tc(lr=1.0, min_lr=0.1, warmup_steps=10, lr_schedule="cosine", max_steps=110)
    assert techniques.lr_at(0, cfg) == pytest.approx(0.1)
    assert techniques.lr_at(4, cfg) == pytest.approx(0.5)
    assert techniques.lr_at(9, cfg) == pytest.approx(1.0)
    assert techniques.lr_at(10, cfg) == pytest.approx(1.0)  # the cosine starts at the peak
    assert techniques.lr_at(60, cfg) == pytest.approx(0.55)  # half-way: the mean of lr and min_lr
    assert techniques.lr_at(110, cfg) == pytest.approx(0.1)
    assert techniques.lr_at(500, cfg) == pytest.approx(0.1)  # past max_steps: the floor
    values = [techniques.lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_warmup_then_constant() -> None:
    cfg = tc(lr=0.5, warmup_steps=4)
    assert [techniques.lr_at(s, cfg) for s in range(6)] == pytest.approx([0.125, 0.25, 0.375, 0.5, 0.5, 0.5])


def test_set_lr_writes_every_group() -> None:
    model = nn.Linear(4, 4)
    opt = techniques.build_optimizer(model, tc(weight_decay=0.1), CPU)
    techniques.set_lr(opt, 0.123)
    assert [g["lr"] for g in opt.param_groups] == [0.123, 0.123]


def _model_with_grads(scale: float) -> nn.Linear:
    model = nn.Linear(3, 2)
    for p in model.parameters():
        p.grad = torch.full_like(p, scale)
    return model


def test_clip_returns_the_norm_and_clips_only_when_asked() -> None:
    model = _model_with_grads(2.0)
    expected = math.sqrt(8 * 2.0**2)  # 6 weights + 2 biases, each 2.0
    norm = techniques.clip_grad_norm(model.parameters(), 0.0)
    assert norm.item() == pytest.approx(expected)
    assert model.weight.grad is not None and torch.all(torch.eq(model.weight.grad, 2.0))  # measured, untouched

    norm = techniques.clip_grad_norm(model.parameters(), 1.0)
    assert norm.item() == pytest.approx(expected)  # the norm before clipping
    clipped = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).norm()
    assert clipped.item() == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize(("precision", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16),
                                                    ("fp16", torch.float16)])
def test_autocast_dtype_on_cpu(precision: str, dtype: torch.dtype) -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with techniques.autocast(precision, CPU):
        assert (a @ b).dtype == dtype


def test_grad_scaler_only_for_fp16() -> None:
    assert techniques.grad_scaler("fp32", CPU) is None
    assert techniques.grad_scaler("bf16", CPU) is None
    assert isinstance(techniques.grad_scaler("fp16", CPU), torch.amp.GradScaler)


def test_optimizer_is_foreach_adamw_on_cpu_with_decay_only_on_matrices() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    opt = techniques.build_optimizer(model, tc(weight_decay=0.1), CPU)
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_no_weight_decay_is_adam_bit_for_bit() -> None:
    def run(make: object) -> torch.Tensor:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        opt = make(model)  # type: ignore[operator]
        for _ in range(5):
            loss = model(torch.randn(4, 8)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    adam = run(lambda m: torch.optim.Adam(m.parameters(), lr=1e-2))
    ours = run(lambda m: techniques.build_optimizer(m, tc(lr=1e-2), CPU))
    assert torch.equal(adam, ours)


@pytest.mark.gpu
def test_optimizer_is_fused_on_cuda() -> None:
    model = nn.Linear(4, 4).cuda()
    opt = techniques.build_optimizer(model, tc(), torch.device("cuda"))
    assert opt.defaults["fused"] is True


@pytest.mark.gpu
def test_bf16_autocast_on_cuda_and_known_peak() -> None:
    a = torch.randn(64, 64, device="cuda")
    with techniques.autocast("bf16", torch.device("cuda")):
        assert (a @ a).dtype == torch.bfloat16
    name = torch.cuda.get_device_name()
    if any(key in name for key in techniques.GPU_PEAK_FLOPS):
        assert techniques.gpu_peak_flops(torch.device("cuda")) in techniques.GPU_PEAK_FLOPS.values()


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA GeForce RTX 4090", None),
])
def test_gpu_peak_by_device_name(name: str, peak: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """MFU's denominator: the PCIe H100 is not credited with the SXM part's peak; an unknown GPU
    gets none (no MFU rather than a wrong one). No GPU is needed: the name is what is read."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert techniques.gpu_peak_flops(torch.device("cuda", 0)) == peak


def test_micro_step_on_a_plain_module_is_a_no_op() -> None:
    model = nn.Linear(2, 2)
    with techniques.micro_step(model, final=False):
        model(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad is not None


def test_cpu_peak_is_positive_and_no_gpu_peak_on_cpu() -> None:
    assert techniques.measure_cpu_peak_flops(size=128, reps=2) > 0
    assert techniques.gpu_peak_flops(CPU) is None


@pytest.mark.parametrize("compile_", [False, True])
def test_deterministic_kernels_without_importing_inductor_unless_compiling(compile_: bool) -> None:
    """``train.deterministic`` turns torch's flag on in a fresh rank; only a compiled model pays
    for importing Inductor (0.7-0.8 s of CPU a rank), whose own deterministic flag it reads."""
    code = ("import sys, torch\nfrom db.vocabulary.config import TrainConfig\nfrom trainer import techniques\n"
            f"techniques.use_deterministic_algorithms(TrainConfig(deterministic=True, compile={compile_}))\n"
            "inductor = sys.modules.get('torch._inductor.config')\n"
            "print(torch.are_deterministic_algorithms_enabled(), inductor is not None,"
            " inductor is not None and inductor.deterministic)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["True", str(compile_), str(compile_)]


RANK_MARKS = {"spawned": 205.0, "imported": 207.5, "joined": 207.75, "data": 208.5, "checkpoint": 208.75}


def test_a_retry_reads_the_cpu_peak_its_run_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempt measures the CPU peak and keeps it with the run; a later attempt on the
    same host reads it and measures nothing (every rank waited for that measurement at start-up);
    another host's figure is measured anew."""
    kept = tmp_path / "cpu_peak.json"
    measured: list[float] = []

    def measure() -> float:
        measured.append(1.5e11)
        return 1.5e11

    monkeypatch.setattr(techniques, "measure_cpu_peak_flops", measure)
    assert techniques.shared_cpu_peak_flops(kept) == 1.5e11 and len(measured) == 1
    assert techniques.shared_cpu_peak_flops(kept) == 1.5e11 and len(measured) == 1  # read back
    kept.write_text(json.dumps({"host": "elsewhere", "flops": 9e9}))
    assert techniques.shared_cpu_peak_flops(kept) == 1.5e11 and len(measured) == 2
    assert techniques.shared_cpu_peak_flops(None) == 1.5e11 and len(measured) == 3  # outside runyard: measured
