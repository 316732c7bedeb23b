"""A small training state (model, optimizer, RNG and plain values) and what the checkpoint tests
ask of it: saved at some steps, and compared value by value after a load.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint import CheckpointManager


def training_state(seed: int = 0) -> dict[str, Any]:
    """A model's and an optimizer's state after one step, the RNGs and plain values, from ``seed``."""
    torch.manual_seed(seed)
    random.seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 8)).pow(2).mean().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        "step": 7,
        "epoch": 2,
        "extra": {"name": "mlp", "blob": b"\x00\x01", "none": None, "pair": (1, 2.5), "lr": [1e-3]},
    }


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    """``a`` and ``b`` hold the same values, tensor by tensor, bit for bit; ``where`` names the place."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def saved_at(root: Path, *steps: int, **kwargs: Any) -> CheckpointManager:
    """A manager on ``root`` (with ``kwargs``) that has saved a training state at each of ``steps``."""
    manager = CheckpointManager(root, **kwargs)
    for step in steps:
        manager.save(step, training_state(step), metrics={"loss": 1.0 / (step + 1)})
        manager.wait()
    return manager
