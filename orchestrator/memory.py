"""The memory a built-in workload's config implies, checked against the machine at submit.

A config such as ``workload.hidden = 65536`` or a gpt-char with ``n_embd = 16384`` and 96 layers
passes every per-field bound and then dies at launch (or takes the machine down with it). The
estimate here is a lower bound, so that a config it refuses truly cannot fit, never one that
would have run:

- parameters, gradients and AdamW's two moments in fp32: 16 bytes per parameter (sharded over
  the ranks under FSDP); gpt-char's vocabulary depends on the text and is not counted;
- activations kept for the backward pass, per rank: a transformer block keeps about 16 values
  of ``n_embd`` per token in eager mode (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models": 34 bytes in 16 bits, less the two dropout masks
  this model has not, and no attention matrix with fused attention). torch.compile may recompute
  the cheap ones (LayerNorm and GELU outputs), so 10 are counted: the block's input, q, k, v,
  the attention output, the residual after attention, and the MLP's hidden layer (4). 2 bytes
  each under bf16/fp16 autocast, 4 in fp32; with activation checkpointing only each block's
  input is kept, plus one block's while it is recomputed. Measured: the ~127M GPT of
  bench/bench_gpu.py at batch 64 in bf16 peaked at 25 GiB on an H100 (docs/benchmarks-journal.md,
  "GPT ~124M in bf16"); this counts 14.4 GiB.

On a CPU machine every rank lives in the same RAM, so the ranks' estimates add up; on a GPU
machine each rank has its own GPU, so one rank's estimate is compared with the smallest GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from db.vocabulary.config import GptCharWorkload, MlpDigitsWorkload, RunConfig, workload_as
from db.vocabulary.inventory import Inventory

GIB = 1024**3
# fp32 parameter + gradient + AdamW exp_avg + exp_avg_sq.
STATE_BYTES_PER_PARAM = 16
# Values of n_embd per token that one transformer block keeps for its backward pass however it
# is compiled (see the module docstring).
BLOCK_ACTIVATIONS_PER_TOKEN = 10


@dataclass(frozen=True)
class MemoryEstimate:
    """A lower bound on one rank's memory."""

    parameters: int
    state_bytes: int  # parameters, gradients and optimizer state of one rank
    activation_bytes: int  # activations of one rank's micro-batch

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes


def gpt_char_parameters(config: RunConfig) -> int:
    """Parameters of gpt-char without the token embedding (its size depends on the text)."""
    w = workload_as(config.workload, GptCharWorkload)
    h = w.n_embd
    per_block = 12 * h * h + 4 * h  # qkv 3h^2, proj h^2, MLP 8h^2, two LayerNorms
    return w.n_layer * per_block + w.block_size * h + 2 * h  # + position embedding, final LayerNorm


def mlp_digits_parameters(config: RunConfig) -> int:
    """Parameters of the mlp-digits MLP (64 inputs, two hidden layers, 10 classes)."""
    hidden = workload_as(config.workload, MlpDigitsWorkload).hidden
    return 64 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10


def estimate(config: RunConfig) -> MemoryEstimate | None:
    """A lower bound on one rank's memory for a built-in workload; ``None`` for a script."""
    w = config.workload
    train = config.train
    value_bytes = 4 if train.precision == "fp32" else 2
    if isinstance(w, GptCharWorkload):
        params = gpt_char_parameters(config)
        tokens = train.batch_size * w.block_size
        kept = (w.n_layer + BLOCK_ACTIVATIONS_PER_TOKEN) if train.activation_checkpointing \
            else w.n_layer * BLOCK_ACTIVATIONS_PER_TOKEN
        activations = tokens * w.n_embd * kept * value_bytes
    elif isinstance(w, MlpDigitsWorkload):
        params = mlp_digits_parameters(config)
        activations = train.batch_size * (64 + 2 * w.hidden) * 4  # the input, two ReLU outputs
    else:
        return None
    shards = config.launch.world_size if config.parallel.strategy == "fsdp" else 1
    state = STATE_BYTES_PER_PARAM * params // shards
    return MemoryEstimate(parameters=params, state_bytes=state, activation_bytes=activations)


def _largest_field(config: RunConfig, est: MemoryEstimate) -> str:
    """The field a person is most likely to shrink, named first in the message."""
    w, t = config.workload, config.train
    if est.activation_bytes > est.state_bytes:
        return f"train.batch_size = {t.batch_size}"
    if isinstance(w, MlpDigitsWorkload):
        return f"workload.hidden = {w.hidden}"
    return f"workload.n_embd = {workload_as(w, GptCharWorkload).n_embd}"


def check_memory(config: RunConfig, inventory: Inventory) -> list[str]:
    """Problems when the config's memory cannot fit on this machine (an empty list otherwise)."""
    est = estimate(config)
    if est is None or config.launch.executor == "slurm":
        return []  # a Slurm run's nodes are not this machine
    ranks = config.launch.world_size  # every local node's ranks share this machine
    if inventory.kind == "gpu" and inventory.gpu_memory_bytes:
        need, limit = est.total_bytes, min(inventory.gpu_memory_bytes)
        where = f"the smallest GPU has {limit / GIB:.1f} GiB"
        per = "per rank (one GPU each)"
    elif inventory.memory_bytes:
        need, limit = est.total_bytes * ranks, inventory.memory_bytes
        where = f"this machine has {limit / GIB:.1f} GiB of RAM"
        per = f"for {ranks} rank(s) sharing the RAM"
    else:
        return []
    if need <= limit:
        return []
    fields = "workload.hidden or train.batch_size" if config.workload.kind == "mlp-digits" else \
        "workload.n_layer, workload.n_embd, workload.block_size or train.batch_size (or use activation_checkpointing)"
    return [
        f"{_largest_field(config, est)}: the config needs at least {need / GIB:.1f} GiB {per} "
        f"({est.parameters:,} parameters: {est.state_bytes / GIB:.1f} GiB of weights, gradients and AdamW state, "
        f"{est.activation_bytes / GIB:.1f} GiB of activations per rank) and {where}; make {fields} smaller"
    ]
