"""[train] and [parallel]: the built-in workloads' optimisation and parallelism. Which kind reads
which of these keys is the [workload] union's to say (``Workload.ignores``, db/vocabulary/config/workload.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from db.vocabulary.config.base import INT64_MAX, SEED_MAX, _Section, lenient
from db.vocabulary.config.workload import STORED


class TrainConfig(_Section):
    """The training loop."""

    max_steps: int = Field(default=300, ge=1, le=INT64_MAX)
    """Optimizer steps to run; the run succeeds when the last one completes."""

    batch_size: int = Field(default=64, ge=1, le=INT64_MAX)
    """Samples per step per rank (the global batch is batch_size x ranks)."""

    lr: float = Field(default=0.001, gt=0, allow_inf_nan=False, title="Learning rate")
    """Learning rate of the Adam optimizer."""

    weight_decay: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """AdamW weight decay (0: plain Adam). AdamW is fused on CUDA."""

    warmup_steps: int = Field(default=0, ge=0, le=INT64_MAX)
    """Linear learning-rate warm-up from 0 over this many steps (at most `max_steps`)."""

    @field_validator("warmup_steps")
    @classmethod
    def _warmup_within_run(cls, warmup_steps: int, info: ValidationInfo) -> int:
        """A warm-up longer than the run never reaches ``lr``: refused up front, naming both
        fields (a config stored before this rule still opens)."""
        stored = isinstance(info.context, dict) and bool(info.context.get(STORED))
        max_steps = info.data.get("max_steps")  # absent when it failed its own check
        if not (lenient(info) or stored) and max_steps is not None and warmup_steps > max_steps:
            raise ValueError(f"more than train.max_steps = {max_steps} (the learning rate would never reach "
                             "train.lr); lower train.warmup_steps or raise train.max_steps")
        return warmup_steps

    lr_schedule: Literal["constant", "cosine"] = Field(
        default="constant", title="Learning-rate schedule"
    )
    """After warm-up: keep `lr`, or decay it along a cosine to `min_lr` at max_steps."""

    min_lr: float = Field(
        default=0.0, ge=0, allow_inf_nan=False, title="Minimum learning rate"
    )
    """Floor of the cosine schedule."""

    clip_grad_norm: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Clip the global gradient norm to this value (0: no clipping; the norm is reported anyway)."""

    precision: Literal["fp32", "bf16", "fp16"] = Field(default="fp32")
    """Autocast precision of the forward pass; fp16 adds a GradScaler whose scale is reported."""

    compile: bool = Field(default=False)
    """torch.compile the model: the whole model under DDP or one rank, each block under FSDP.
    The first steps are slower while it compiles."""

    activation_checkpointing: bool = Field(default=False)
    """Recompute each block's activations in the backward pass to save memory (gpt-char)."""

    grad_accum: int = Field(
        default=1, ge=1, le=INT64_MAX, title="Gradient accumulation (micro-batches)"
    )
    """Micro-batches of `batch_size` accumulated per optimizer step (DDP skips the gradient
    all-reduce on all but the last). The effective per-rank batch is batch_size x grad_accum."""

    seed: int = Field(default=0, ge=0, le=SEED_MAX)
    """Seed of every random generator; all ranks use the same model seed."""

    log_every: int = Field(default=10, ge=1, le=INT64_MAX)
    """Report per-rank training metrics every this many steps."""

    eval_every: int = Field(default=100, ge=0, le=INT64_MAX)
    """Evaluate on the held-out split every this many steps (0: only at the end)."""

    deterministic: bool = Field(default=False)
    """Use torch's deterministic algorithms (and seeded data order), so that a resumed run
    repeats the uninterrupted one bit for bit; may be slower on GPU."""


class ParallelConfig(_Section):
    """How the model is spread over the ranks."""

    strategy: Literal["ddp", "fsdp"] = Field(default="ddp")
    """`ddp`: every rank holds the whole model. `fsdp`: FSDP2 (`fully_shard` per block, then the
    root) with sharded checkpoints: every rank writes its own shards (PyTorch Distributed
    Checkpoint), nothing is gathered to one rank, and a fork may run on another number of ranks
    (gpt-char)."""
