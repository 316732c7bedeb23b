"""Training techniques shared by the built-in workloads, each a small function of the run config.

The optimizer (AdamW: fused on CUDA, foreach otherwise; weight decay only on matrices), the
learning rate at a step (linear warm-up, then constant or cosine), autocast and the fp16
GradScaler, gradient-norm clipping that always reports the norm, and gradient accumulation that
skips the gradient all-reduce on all but the last micro-batch.

The learning rate is a pure function of the step and is written into the optimizer before every
step, so a resumed run needs no scheduler state: the step in the checkpoint is enough.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from db.vocabulary.config import TrainConfig

# bf16 dense peak FLOP/s of one GPU (NVIDIA's spec sheets, without sparsity), by a fragment of
# torch.cuda.get_device_name(); the first fragment found wins, so the PCIe H100 (fewer SMs, lower
# clocks) comes before the SXM one ("NVIDIA H100 80GB HBM3").
GPU_PEAK_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build_optimizer(model: nn.Module, tc: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the model's trainable parameters.

    With ``weight_decay > 0`` the parameters are split into two groups: matrices (embeddings,
    linear weights) decay, vectors (biases, norms) do not. With ``weight_decay == 0`` there is one
    group, so the optimizer (and its state dict) is the same as a plain ``Adam(model.parameters())``
    and equal to it bit for bit.

    Args:
        model: The model (unwrapped, or FSDP-sharded: its parameters are what is optimized).
        tc: The ``[train]`` section (``lr``, ``weight_decay``).
        device: Where the parameters live: fused kernels on CUDA, foreach otherwise.

    Returns:
        The optimizer.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if tc.weight_decay > 0:
        groups: list[dict[str, Any]] = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
    else:
        groups = [{"params": params, "weight_decay": 0.0}]
    if device.type == "cuda":
        return torch.optim.AdamW(groups, lr=tc.lr, fused=True)
    return torch.optim.AdamW(groups, lr=tc.lr, foreach=True)


def lr_at(step: int, tc: TrainConfig) -> float:
    """The learning rate of optimizer step ``step`` (0-based: the first step is step 0).

    Linear warm-up from ``lr / warmup_steps`` to ``lr`` over the first ``warmup_steps`` steps,
    then ``lr`` (``constant``) or a cosine from ``lr`` down to ``min_lr`` at ``max_steps``.

    Args:
        step: Optimizer steps already taken.
        tc: The ``[train]`` section.

    Returns:
        The learning rate.
    """
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    if tc.lr_schedule == "constant":
        return tc.lr
    decay_steps = max(1, tc.max_steps - tc.warmup_steps)
    progress = min(1.0, (step - tc.warmup_steps) / decay_steps)
    return tc.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (tc.lr - tc.min_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Write ``lr`` into every parameter group (before ``optimizer.step()``)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of the forward pass for ``train.precision`` on ``device``.

    ``fp32`` is a null context (nothing changes); ``bf16`` and ``fp16`` autocast on the device's
    type (cpu or cuda).
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """A GradScaler for ``fp16`` (its state belongs in the checkpoint); None otherwise."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


def optimizer_update(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, max_norm: float) -> torch.Tensor:
    """The end of a training step: unscale (fp16), measure and clip the gradient norm, step the
    optimizer (through the GradScaler when there is one).

    Returns:
        The gradient norm before clipping, a 0-d tensor on the gradients' device.
    """
    if scaler is not None:
        scaler.unscale_(optimizer)
    norm = clip_grad_norm(model.parameters(), max_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return norm


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """The global gradient norm, computed always; the gradients are clipped to ``max_norm`` when
    it is above 0.

    FSDP's sharded gradients give a sharded norm; it is gathered into a plain tensor.

    Args:
        parameters: The model's parameters (their ``.grad``, unscaled).
        max_norm: The clipping threshold (0: only measure).

    Returns:
        The norm before clipping, a 0-d tensor on the gradients' device.
    """
    params = [p for p in parameters if p.grad is not None]
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    full_tensor = getattr(norm, "full_tensor", None)  # a DTensor under FSDP
    return full_tensor() if full_tensor is not None else norm


@contextlib.contextmanager
def micro_step(model: nn.Module, final: bool) -> Iterator[None]:
    """Context for one micro-batch's forward and backward in gradient accumulation.

    On all but the ``final`` micro-batch the gradient all-reduce is skipped: DDP's ``no_sync()``,
    or FSDP2's ``set_requires_gradient_sync(False)``. A plain module needs nothing.

    Args:
        model: The DDP, FSDP or plain model that runs forward and backward.
        final: Whether this is the last micro-batch of the optimizer step.
    """
    if final:
        yield
    elif isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    elif (set_sync := getattr(model, "set_requires_gradient_sync", None)) is not None:  # FSDP2
        set_sync(False)
        try:
            yield
        finally:
            set_sync(True)
    else:
        yield


def gpu_peak_flops(device: torch.device) -> float | None:
    """The bf16 peak FLOP/s of a known GPU (H100, H200, A100); None for another or no GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_FLOPS.items() if key in name), None)


def use_deterministic_algorithms(tc: TrainConfig) -> None:
    """``train.deterministic``: deterministic kernels (or an error where an op has none), and
    cuBLAS's fixed workspace that CUDA needs for them.

    ``torch.use_deterministic_algorithms`` also sets the flag in TorchInductor's config, and
    importing that config imports Dynamo, Inductor and sympy: 0.7-0.8 s of CPU in every rank
    (measured with py-spy on a 2-rank digits run, 3.3 s of CPU per rank in all). Only a compiled
    model reads Inductor's flag, so the others set the kernel flag alone; it is the same call
    torch makes after setting Inductor's.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if tc.compile or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(True)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=False)


def peak_flops(device: torch.device, kept: Path | None = None) -> float | None:
    """What MFU is measured against: a known GPU's bf16 spec-sheet peak, this CPU's measured
    float32 matmul rate (:func:`shared_cpu_peak_flops`, kept in ``kept`` for the run's later
    attempts), or None for another GPU (no MFU then). Collective on a CPU: every rank calls it."""
    if device.type == "cpu":
        return shared_cpu_peak_flops(kept)
    return gpu_peak_flops(device)


def kept_cpu_peak_flops(kept: Path | None) -> float:
    """The CPU peak an earlier attempt of the run measured on this host (``kept``), else measured
    now and kept there. A retry's ranks then wait for no measurement at start-up (0.09 s on a
    quiet 2-core VM, every rank waiting on rank 0; more under load: issue 32). A file that
    cannot be read or written is measured around."""
    host = socket.gethostname()
    if kept is not None:
        try:
            record = json.loads(kept.read_text())
            if record.get("host") == host and float(record["flops"]) > 0:
                return float(record["flops"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    value = measure_cpu_peak_flops()
    if kept is not None:
        with contextlib.suppress(OSError):
            tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"host": host, "flops": value}))
            os.replace(tmp, kept)
    return value


def shared_cpu_peak_flops(kept: Path | None = None) -> float:
    """This CPU's measured peak, one number for every rank of the process group: rank 0
    measures it (about 0.1-0.3 s; or reads an earlier attempt's, :func:`kept_cpu_peak_flops`)
    while the others wait at the broadcast. Each rank measuring its own gave MFUs of 15.7% and
    9.5% to two ranks with equal step times, as the ranks' measurements competed with each other
    and the rest of the machine for the cores."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return kept_cpu_peak_flops(kept)
    value = torch.tensor([kept_cpu_peak_flops(kept) if dist.get_rank() == 0 else 0.0], dtype=torch.float64)
    dist.broadcast(value, src=0)
    return float(value.item())


def measure_cpu_peak_flops(size: int = 1024, reps: int = 5) -> float:
    """FLOP/s of this process's float32 matmuls on the CPU: the best of ``reps`` timed
    ``size x size`` products after one warm-up (a measured stand-in for a spec-sheet peak)."""
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    torch.mm(a, b)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best
