"""The trainer: the entry point run under torchrun (``python -m trainer``), built-in workloads,
distributed set-up and the metric reporter.

Importing this package must stay cheap and must not import torch: the UI and the scheduler
import ``trainer.config``.
"""


class TrainerError(Exception):
    """Base exception of the trainer package."""
