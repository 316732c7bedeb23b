"""Built-in workloads. Each module exposes
``train(config, info, ctx, reporter, stop) -> dict`` and is run by ``python -m trainer``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

MODULES = {"mlp-digits": "trainer.workloads.mlp_digits", "gpt-char": "trainer.workloads.gpt_char"}


def load_workload(kind: str) -> Callable[..., dict[str, Any]]:
    """The ``train`` function of a built-in workload (imported on demand: torch is heavy)."""
    if kind not in MODULES:
        raise ValueError(f"workload.kind = {kind!r} is not a built-in workload; built-in: {', '.join(MODULES)}")
    return importlib.import_module(MODULES[kind]).train
