"""Every random generator's state, in a form ``torch.load(weights_only=True)`` accepts."""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch


def capture() -> dict[str, Any]:
    """Python, NumPy, torch CPU and (when present) CUDA generator states."""
    # The legacy form is a tuple; numpy's stubs type it as that tuple or a dict.
    legacy = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state(legacy=True))
    kind, keys, pos, has_gauss, cached = legacy
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    """Put back what :func:`capture` took."""
    random.setstate(_as_tuples(state["python"]))
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(value: Any) -> Any:
    """random.setstate needs tuples; a round trip through some serialisers yields lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(v) for v in value)
    return value
