"""Built-in workloads, run by ``python -m trainer`` on the SDK's ``Run`` as your own script would be.

Each is a class that follows :class:`Workload` (torchtune's recipe idea: a protocol, no base
class to inherit from), built from the run's config by :func:`build_workload`. Both train in the
one loop of :mod:`trainer.workloads.loop`, nanoGPT's, to which each hands its batches, loss,
evaluation and checkpoint state. Importing this package does not import torch;
:func:`build_workload` imports the workload's module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from db.vocabulary.config import RunConfig
    from trainer.sdk import Run

# kind -> (module, class)
BUILT_IN = {
    "mlp-digits": ("trainer.workloads.mlp_digits", "MLPDigits"),
    "gpt-char": ("trainer.workloads.gpt_char", "GPTChar"),
}


class Workload(Protocol):
    """A training recipe. ``python -m trainer`` builds it from the config (which it may refuse,
    naming the options), joins the run with ``trainer.init()``, then on every rank calls
    :meth:`setup`, :meth:`train` and ``run.finish()`` (``run.close()`` instead after a failure).

    Everything that outlives one step (checkpoints and resume, RNG states, the stop signal,
    metrics and health checks, the notes for the scheduler) is the ``Run``'s, and the step loop
    is :func:`trainer.workloads.loop.train`'s: a workload holds only its data, model and loss.
    """

    def setup(self, run: Run) -> None:
        """Build data, model and optimizer on ``run.device``, then resume with ``run.load_checkpoint``."""
        ...

    def train(self, run: Run) -> dict[str, float]:
        """Train until the last step or ``run.should_stop()``; returns a summary for the log."""
        ...


def build_workload(config: RunConfig) -> Workload:
    """The built-in workload of ``config.workload.kind``, built from ``config``.

    Raises:
        ValueError: The kind is not a built-in workload, or the workload cannot honour the
            config (the message names the options).
    """
    kind = config.workload.kind
    if kind not in BUILT_IN:
        raise ValueError(f"workload.kind = {kind!r} is not a built-in workload; built-in: {', '.join(BUILT_IN)}")
    module, name = BUILT_IN[kind]
    workload: Workload = getattr(importlib.import_module(module), name)(config)
    return workload
