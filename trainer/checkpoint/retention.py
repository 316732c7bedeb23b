"""Which checkpoints to keep: the last N, the best K by a metric, every pinned one, and never
the only verified one. A pure decision; trainer/checkpoint/history.py applies it to a run's
checkpoint records from the database writer thread."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from trainer.checkpoint.io import CheckpointError


@dataclass(frozen=True)
class CheckpointInfo:
    """What the retention policy needs to know about one checkpoint."""

    step: int
    verified: bool
    pinned: bool = False
    metric: float | None = None



def select_kept(
    checkpoints: Sequence[CheckpointInfo],
    keep_last: int,
    keep_best: int,
    best_mode: Literal["min", "max"] = "min",
) -> set[int]:
    """Choose the checkpoints to keep.

    Kept: the newest ``keep_last`` verified steps, the ``keep_best`` verified steps with the
    best metric (None and NaN never count; ties go to the newer step), and every pinned step.
    When some checkpoint is verified but none of those is, the newest verified one is kept.

    Args:
        checkpoints: The checkpoints that exist.
        keep_last: How many of the newest verified steps to keep; 0 disables this rule.
        keep_best: How many of the best verified steps to keep; 0 disables this rule.
        best_mode: "min" when a lower metric is better, "max" when a higher one is.

    Returns:
        The steps to keep; every other step may be deleted.

    Raises:
        CheckpointError: A count is negative or ``best_mode`` is unknown.
    """
    if keep_last < 0 or keep_best < 0:
        raise CheckpointError(f"keep_last={keep_last} and keep_best={keep_best} must be >= 0")
    if best_mode not in ("min", "max"):
        raise CheckpointError(f"best_mode={best_mode!r} must be 'min' or 'max'")
    verified = sorted((c for c in checkpoints if c.verified), key=lambda c: c.step, reverse=True)
    kept = {c.step for c in verified[:keep_last]}
    scored = [c for c in verified if c.metric is not None and not math.isnan(c.metric)]
    sign = 1.0 if best_mode == "min" else -1.0
    scored.sort(key=lambda c: (sign * float(c.metric), -c.step))  # type: ignore[arg-type]
    kept.update(c.step for c in scored[:keep_best])
    kept.update(c.step for c in checkpoints if c.pinned)
    if verified and not kept & {c.step for c in verified}:
        kept.add(verified[0].step)
    return kept

