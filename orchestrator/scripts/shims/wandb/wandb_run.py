"""``wandb.wandb_run``: where frameworks import ``Run`` from (runyard's stand-in)."""

from . import Run  # relative: this package is `wandb` in the ranks

__all__ = ["Run"]
