"""[checkpoint]: when checkpoints are written and which are kept."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from db.vocabulary.config.base import INT64_MAX, _Section


class CheckpointConfig(_Section):
    """When checkpoints are written and which are kept."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, validate_default=True, populate_by_name=True,
        strict=True,
    )

    every_steps: int = Field(default=100, ge=0, le=INT64_MAX, title="Save every (steps)")
    """Save every this many steps (0: not by steps). A final checkpoint is always written at the
    end of the run."""

    every_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False, title="Save every (seconds)")
    """Also save when this many seconds passed since the last save (0: not by time)."""

    keep_last: int = Field(default=3, ge=0, le=INT64_MAX)
    """Keep the newest this many checkpoints (0: keep all)."""

    keep_best: int = Field(default=1, ge=0, le=INT64_MAX)
    """Also keep the best this many by `best_metric`."""

    best_metric: str = Field(default="eval_loss", min_length=1)
    """Metric that ranks checkpoints for `keep_best` (any reported metric name)."""

    best_mode: Literal["min", "max"] = "min"
    """Whether a lower (`min`) or higher (`max`) `best_metric` is better."""

    async_save: bool = Field(default=True, alias="async", title="Write in the background (async)")
    """Write in a background thread, which also copies the state to CPU memory while the next
    step's forward and backward run (the loop waits only if the copy is not done by the next
    optimizer step); `false` writes synchronously, for debugging. Key: `async`."""
