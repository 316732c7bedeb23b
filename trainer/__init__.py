"""The trainer: the entry point run under torchrun (``python -m trainer``), built-in workloads,
distributed set-up and the metric reporter.

Importing this package must stay cheap and must not import torch: the UI and the scheduler
import ``db.vocabulary.config``. ``trainer.init()`` (the SDK for your own scripts, trainer/sdk.py)
is loaded on first use.
"""

from typing import Any


class TrainerError(Exception):
    """Base exception of the trainer package."""


def __getattr__(name: str) -> Any:
    if name in ("init", "Run"):
        from trainer import sdk  # noqa: PLC0415 - the SDK imports torch: loaded on first use

        return getattr(sdk, name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
