"""The memory bound at submit: the parameter counts match the real models, a config that cannot
fit is refused with the estimate and the limit, and the shipped configs are not refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from db.vocabulary.config import ConfigError, RunConfig, field_of, load_config, parse_config
from db.vocabulary.inventory import Inventory
from orchestrator.memory import GIB, MemoryEstimate, check_memory, estimate, gpt_char_parameters, mlp_digits_parameters
from orchestrator.submission import validate
from tests.unit.paths import ROOT
from trainer.workloads.gpt_char import GPT
from trainer.workloads.mlp_digits import build_model

# A GPU machine as NVML would describe it (no GPU here, so the inventory is constructed).
H100 = Inventory(kind="gpu", slots=8, gpu_names=("NVIDIA H100 80GB HBM3",) * 8,
                 gpu_memory_bytes=(80 * GIB,) * 8, memory_bytes=512 * GIB)
LAPTOP = Inventory(kind="cpu", slots=4, memory_bytes=8 * GIB)


def test_gpt_char_parameters_match_the_real_model() -> None:
    config = parse_config({"workload": {"kind": "gpt-char", "n_layer": 3, "n_embd": 96, "n_head": 4, "block_size": 64}})
    vocab = 70
    model = GPT(vocab, 3, 4, 96, 64)
    real = sum(p.numel() for p in model.parameters())
    assert gpt_char_parameters(config) == real - vocab * 96  # the tied token embedding is left out


def test_mlp_digits_parameters_match_the_real_model() -> None:
    config = parse_config({"workload": {"hidden": 300}})
    assert mlp_digits_parameters(config) == sum(p.numel() for p in build_model(300).parameters())


def test_a_config_no_machine_can_hold_is_refused_with_the_estimate_and_the_limit() -> None:
    data = {"workload": {"kind": "gpt-char", "n_layer": 96, "n_embd": 16384, "n_head": 128},
            "launch": {"nproc_per_node": 1}}
    with pytest.raises(ConfigError) as info:
        validate(data, H100)
    (problem,) = info.value.problems
    assert field_of(problem) == "workload.n_embd" and "16384" in problem
    assert "GiB" in problem and "the smallest GPU has 80.0 GiB" in problem and "AdamW" in problem


def estimated(config: RunConfig) -> MemoryEstimate:
    """The estimate of a built-in workload's config (a script has none)."""
    found = estimate(config)
    assert found is not None, config.workload
    return found


def test_on_a_cpu_machine_the_ranks_share_the_ram() -> None:
    one = parse_config({"workload": {"hidden": 12288}, "launch": {"nproc_per_node": 1}})
    four = parse_config({"workload": {"hidden": 12288}, "launch": {"nproc_per_node": 4}})
    per_rank = estimated(one).total_bytes
    assert 2 * GIB < per_rank < 3 * GIB  # 152M parameters x 16 bytes
    assert check_memory(one, LAPTOP) == []
    (problem,) = check_memory(four, LAPTOP)
    assert field_of(problem) == "workload.hidden" and "4 rank(s)" in problem and "8.0 GiB of RAM" in problem


def test_fsdp_shards_the_state_and_checkpointing_shrinks_the_activations() -> None:
    base: dict[str, Any] = {
            "workload": {"kind": "gpt-char", "n_layer": 24, "n_embd": 2048, "n_head": 16, "block_size": 1024},
            "train": {"batch_size": 8, "precision": "bf16"}, "launch": {"nproc_per_node": 8}}
    ddp = estimated(parse_config(base))
    fsdp = estimated(parse_config({**base, "parallel": {"strategy": "fsdp"}}))
    ckpt = estimated(parse_config({**base, "train": {**base["train"], "activation_checkpointing": True}}))
    assert fsdp.state_bytes * 8 == ddp.state_bytes and fsdp.activation_bytes == ddp.activation_bytes
    assert ckpt.activation_bytes < ddp.activation_bytes / 5 and ckpt.state_bytes == ddp.state_bytes


def test_a_script_has_no_estimate() -> None:
    config = parse_config({"workload": {"kind": "script", "script": "train.py"}})
    assert estimate(config) is None and check_memory(config, LAPTOP) == []


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_the_shipped_configs_fit_a_laptop(path: Path) -> None:
    assert check_memory(load_config(path), LAPTOP) == []


def _saved_activation_bytes(model, inputs) -> int:
    """Bytes of the distinct tensors autograd keeps for the backward pass, parameters excluded."""
    params = {p.data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(inputs)
    out.float().sum().backward()
    return sum(kept.values())


def test_the_activation_estimate_is_a_lower_bound_of_what_autograd_keeps() -> None:
    w = {"kind": "gpt-char", "n_layer": 3, "n_head": 4, "n_embd": 64, "block_size": 32}
    config = parse_config({"workload": w, "train": {"batch_size": 4}})
    model = GPT(65, 3, 4, 64, 32)
    measured = _saved_activation_bytes(model, torch.randint(0, 65, (4, 32)))
    estimated_bytes = estimated(config).activation_bytes
    assert estimated_bytes <= measured < 4 * estimated_bytes, (estimated_bytes, measured)

    config = parse_config({"workload": {"hidden": 128}, "train": {"batch_size": 32}})
    measured = _saved_activation_bytes(build_model(128), torch.randn(32, 64))
    assert estimated(config).activation_bytes <= measured < 4 * estimated(config).activation_bytes
