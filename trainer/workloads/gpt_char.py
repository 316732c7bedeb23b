"""gpt-char: a character-level, decoder-only transformer (nanoGPT-like) on a text file.

Reads top to bottom: data, model, parallelism, and the hooks of the shared training loop
(:meth:`GPTChar.setup` builds and resumes, :func:`trainer.workloads.loop.train` trains; the SDK's
``Run`` does checkpoints, stops and metrics). The default
text is the Python standard library's own sources on this machine (no download). Batches are
windows of ``block_size + 1`` characters at positions drawn from a generator seeded with (seed,
step, rank): they depend only on the step, so a resumed run repeats the uninterrupted one's
batches with no sampler state, and ``grad_accum`` micro-batches split the same windows that one
big batch would take.

Parallelism: ``parallel.strategy = "ddp"`` (DistributedDataParallel) or ``"fsdp"`` (FSDP2:
``fully_shard`` on each block, then the root; checkpoints gather the full state to rank 0).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from db.vocabulary.config import GptCharWorkload, RunConfig, workload_as
from db.vocabulary.layout import RunPaths
from trainer import techniques
from trainer.checkpoint import Stateful
from trainer.process.distributed import DistInfo
from trainer.workloads import loop

if TYPE_CHECKING:
    from trainer.sdk import Run

logger = logging.getLogger(__name__)

VAL_FRACTION = 0.1
DEFAULT_CORPUS_CHARS = 3_000_000
EVAL_BATCHES = 8


# -- data ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CharCorpus:
    """A text as character ids, split into a train part and a validation part (the last 10%)."""

    vocab: str
    train: torch.Tensor
    val: torch.Tensor


def default_corpus_text(max_chars: int = DEFAULT_CORPUS_CHARS) -> str:
    """The standard library's top-level ``.py`` files in name order, concatenated until
    ``max_chars`` characters (deterministic on a given Python installation)."""
    stdlib = Path(os.__file__).parent
    parts: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return "".join(parts)[:max_chars]


def load_corpus(path: str | None) -> CharCorpus:
    """Read ``workload.text`` (or the default corpus) and encode it with a sorted char vocabulary.

    Raises:
        ValueError: The file cannot be read or is too short to split.
    """
    if path is None:
        text = default_corpus_text()
    else:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ValueError(f"workload.text = {path!r}: cannot read it: {exc.strerror}") from None
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    uniques, ids = np.unique(codes, return_inverse=True)
    data = torch.from_numpy(ids.astype(np.int64))
    n_val = int(len(data) * VAL_FRACTION)
    if n_val < 2:
        raise ValueError(f"workload.text = {path!r}: {len(data)} characters is too short for a train/val split")
    vocab = "".join(chr(c) for c in uniques)
    return CharCorpus(vocab=vocab, train=data[:-n_val], val=data[-n_val:])


def window_generator(seed: int, split: str, step: int, rank: int) -> torch.Generator:
    """A generator seeded by (seed, split, step, rank) alone: the batch of a step is reproducible."""
    key = hashlib.blake2b(f"{seed}:{split}:{step}:{rank}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(key, "little") & (2**63 - 1))


def get_batch(
    data: torch.Tensor, block_size: int, count: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` random windows: inputs and the next characters as targets, each (count, block_size)."""
    if len(data) <= block_size + 1:
        raise ValueError(f"workload.block_size = {block_size} is not shorter than the text split ({len(data)} chars)")
    starts = torch.randint(0, len(data) - block_size, (count,), generator=gen)
    windows = data[starts[:, None] + torch.arange(block_size + 1)]
    return windows[:, :-1], windows[:, 1:]


# -- model ---------------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention``."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.proj(y.transpose(1, 2).contiguous().view(B, T, C))  # Module calls are Any
        return out


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd, bias=False), nn.GELU(), nn.Linear(4 * n_embd, n_embd, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        out: torch.Tensor = x + self.mlp(self.ln_2(x))  # Module calls are Any
        return out


class GPT(nn.Module):
    """Token + position embeddings, ``n_layer`` blocks, a final LayerNorm and a tied LM head.

    Args:
        vocab_size: Characters in the vocabulary.
        n_layer: Transformer blocks.
        n_head: Attention heads per block.
        n_embd: Embedding width.
        block_size: Longest context.
        activation_checkpointing: Recompute each block's activations in the backward pass.
    """

    def __init__(self, vocab_size: int, n_layer: int, n_head: int, n_embd: int, block_size: int,
                 activation_checkpointing: bool = False):
        super().__init__()
        self.block_size = block_size
        self.activation_checkpointing = activation_checkpointing
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: https://paperswithcode.com/method/weight-tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):  # residual outputs (GPT-2)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def non_embedding_params(self) -> int:
        """Parameters other than the embeddings (the tied head counts as the token embedding)."""
        return sum(p.numel() for p in self.parameters()) - self.wte.weight.numel() - self.wpe.weight.numel()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) for the character ids ``idx`` (B, T)."""
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            if self.activation_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits: torch.Tensor = self.lm_head(self.ln_f(x))  # Module calls are Any
        return logits


def flops_per_token(model: GPT, n_layer: int, n_embd: int, block_size: int) -> float:
    """Training FLOPs per token (PaLM appendix B, as nanoGPT): 6N + 12 * n_layer * n_embd * T."""
    return 6.0 * model.non_embedding_params() + 12.0 * n_layer * n_embd * block_size


# -- parallelism ---------------------------------------------------------------------------------


class ShardedModelState:
    """An FSDP model's state: its sharded state dict, each rank's DTensor shards (nothing gathered;
    the checkpoint is written by every rank through DCP and loads on any number of ranks)."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict  # noqa: PLC0415 - FSDP's modules (1-3 s, sympy) only for a sharded model

        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict  # noqa: PLC0415 - FSDP's modules (1-3 s, sympy) only for a sharded model

        set_model_state_dict(self.model, state_dict, options=StateDictOptions(full_state_dict=_whole(state_dict)))


class ShardedOptimizerState:
    """An FSDP optimizer's state keyed by parameter name, its tensors sharded as the parameters."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict  # noqa: PLC0415 - FSDP's modules (1-3 s, sympy) only for a sharded model

        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict  # noqa: PLC0415 - FSDP's modules (1-3 s, sympy) only for a sharded model

        set_optimizer_state_dict(self.model, self.optimizer, state_dict,
                                 options=StateDictOptions(full_state_dict=_whole(state_dict)))


def _whole(state_dict: dict[str, Any]) -> bool:
    """A state dict of whole tensors on every rank: a checkpoint an FSDP run saved before runyard
    saved them sharded (gathered to rank 0 and written as one file)."""
    from trainer.checkpoint.sharded import has_shards  # noqa: PLC0415 - DCP (1-2 s) only for a sharded model

    return not has_shards(state_dict)


def parallelize(model: GPT, config: RunConfig, info: DistInfo) -> tuple[nn.Module, nn.Module]:
    """Wrap the model for the strategy and compile it.

    Returns:
        The wrapped model (DDP, FSDP-sharded or the model itself: what gradient accumulation,
        evaluation and the health checks act on) and what the training step calls: the same,
        or with ``train.compile`` its compiled form. DDP and a single rank compile the whole
        model, as nanoGPT does (one graph, the embeddings, final norm and head included); FSDP
        compiles each block before sharding it, as torchtitan does. With FSDP the model itself
        is sharded in place (its parameters become DTensors), so the optimizer must be built
        after this.
    """
    tc = config.train
    if config.parallel.strategy != "fsdp":
        wrapped = DDP(model) if info.world_size > 1 else model
        if not tc.compile:
            return wrapped, wrapped
        if info.is_main:
            logger.info("torch.compile: the whole model (compiled at its first steps)")
        # torch.compile of a module returns a module (OptimizedModule); its stubs say only "callable".
        return wrapped, cast(nn.Module, torch.compile(wrapped))

    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415 - FSDP's modules (1-3 s, sympy) only for a sharded model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: PLC0415 - FSDP's modules (1-3 s, sympy) only for a sharded model

    if tc.compile:
        if info.is_main:
            logger.info("torch.compile: each of the %d blocks (compiled at its first steps)", len(model.blocks))
        for block in model.blocks:
            block.compile()
    mesh = init_device_mesh(info.device.type, (info.world_size,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if tc.precision == "bf16" else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model, model


def check_supported(config: RunConfig) -> None:
    """Refuse option combinations this workload cannot honour, naming them."""
    if config.parallel.strategy == "fsdp" and config.train.precision == "fp16":
        raise ValueError("parallel.strategy = 'fsdp' with train.precision = 'fp16' is not supported "
                         "(the GradScaler would see only each rank's shard); use precision = 'bf16'")


# -- evaluation and metrics ----------------------------------------------------------------------


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


@torch.no_grad()
def evaluate(runner: nn.Module, val: torch.Tensor, config: RunConfig, info: DistInfo) -> float:
    """Mean loss over fixed validation windows (the same at every evaluation), averaged over ranks."""
    tc, wc = config.train, workload_as(config.workload, GptCharWorkload)
    runner.eval()
    gen = window_generator(tc.seed, "val", 0, info.rank)
    total = torch.zeros((), dtype=torch.float64, device=info.device)
    for _ in range(EVAL_BATCHES):
        x, y = get_batch(val, wc.block_size, tc.batch_size, gen)
        with techniques.autocast(tc.precision, info.device):
            logits = runner(x.to(info.device))
        total += cross_entropy(logits, y.to(info.device)).double()
    if info.world_size > 1:
        dist.all_reduce(total)
    runner.train()
    return total.item() / (EVAL_BATCHES * info.world_size)


# -- training ------------------------------------------------------------------------------------


class GPTChar:
    """The gpt-char workload (:class:`~trainer.workloads.Workload`), trained by the shared loop
    (:class:`~trainer.workloads.loop.Recipe`).

    Args:
        config: The run's config (``[workload]`` model and text, ``[train]``, ``[parallel]``).

    Raises:
        ValueError: An option combination it cannot honour (:func:`check_supported`).
    """

    def __init__(self, config: RunConfig) -> None:
        check_supported(config)
        self.config = config
        self.workload = workload_as(config.workload, GptCharWorkload)
        self.tokens_per_sample: int | None = self.workload.block_size

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds besides the step and the RNG states (the Run adds those): the
        model, the optimizer (under FSDP as sharded state dicts, each rank its own shards) and the fp16
        GradScaler. No data position: a step's batches depend on the step alone."""
        state: dict[str, Any] = {"model": self.model_state, "optimizer": self.optim_state}
        if self.scaler is not None:
            state["scaler"] = self.scaler
        return state

    def setup(self, run: Run) -> None:
        tc, wc, info = self.config.train, self.workload, run.info
        self.info = info
        torch.manual_seed(tc.seed)  # every rank builds the same initial model
        if tc.deterministic:
            techniques.use_deterministic_algorithms(tc)
        self.corpus = load_corpus(wc.text)
        self.model = GPT(len(self.corpus.vocab), wc.n_layer, wc.n_head, wc.n_embd, wc.block_size,
                         activation_checkpointing=tc.activation_checkpointing).to(info.device)
        self.flops_per_sample = flops_per_token(self.model, wc.n_layer, wc.n_embd, wc.block_size) * wc.block_size
        kept = RunPaths(run.ctx.run_dir).cpu_peak if run.managed else None  # a retry reads it, measures nothing
        self.peak_flops = techniques.peak_flops(info.device, kept=kept)
        if info.is_main:
            logger.info("gpt-char: vocab %d, train %d chars, %.2fM non-embedding params, peak %s FLOP/s",
                        len(self.corpus.vocab), len(self.corpus.train), self.model.non_embedding_params() / 1e6,
                        f"{self.peak_flops:.3g}" if self.peak_flops else "unknown")

        self.runner, self.forward = parallelize(self.model, self.config, info)
        self.optimizer = techniques.build_optimizer(self.model, tc, info.device)
        self.scaler = techniques.grad_scaler(tc.precision, info.device)
        fsdp = self.config.parallel.strategy == "fsdp"
        self.model_state: Stateful = ShardedModelState(self.model) if fsdp else self.model
        self.optim_state: Stateful = ShardedOptimizerState(self.model, self.optimizer) if fsdp else self.optimizer
        run.watch(self.runner)  # DDP: straggler and desync checks; FSDP: neither (sharded)
        self.step = run.load_checkpoint(self.state())

    def train(self, run: Run) -> dict[str, float]:
        """Train to ``train.max_steps`` (or a stop request); returns the final step and eval loss."""
        return loop.train(run, self, self.config.train)

    def batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The step's windows (drawn from a generator seeded by seed, step and rank), split into
        ``grad_accum`` micro-batches."""
        tc, device = self.config.train, self.info.device
        gen = window_generator(tc.seed, "train", step, self.info.rank)
        xs, ys = get_batch(self.corpus.train, self.workload.block_size, tc.batch_size * tc.grad_accum, gen)
        if device.type == "cuda":  # from pinned memory the copy really does not block
            xs, ys = xs.pin_memory(), ys.pin_memory()
        xs, ys = xs.to(device, non_blocking=True), ys.to(device, non_blocking=True)
        return list(zip(xs.split(tc.batch_size), ys.split(tc.batch_size), strict=True))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cross_entropy(self.forward(x), y)

    def evaluate(self) -> dict[str, float]:
        return {"eval_loss": evaluate(self.runner, self.corpus.val, self.config, self.info)}

    def extra_metrics(self) -> dict[str, float]:
        return {}
