"""What runyard sees of an unchanged training script: its metrics, its checkpoints, its activity.

The pieces, each usable alone:

- ``lines``: the ``RUNYARD {...}`` line protocol and the config's stdout regexes, over an
  incremental tailer of the ranks' log files.
- ``tensorboard``: TensorBoard event files tailed live (``SummaryWriter``, tensorboardX,
  Lightning), each tag on its own step counter, and ``import_logdir`` for past runs.
- ``shims/wandb``: a ``wandb`` module for the ranks that prints the line protocol (the launcher
  puts it first on their path: ``with_wandb_shim`` in orchestrator/executors/launcher.py).
- ``checkpoints``: the script's own checkpoint files, with size, time and sha256.
- ``collector``: one object per attempt that the scheduler polls, and ``write`` into the
  metric store.

Every source produces :class:`Sample` values; the collector stamps them with the run and the
attempt into the rows ``db.metricstore.write_points`` takes.
"""

from __future__ import annotations

from typing import NamedTuple


class ScriptWatchError(Exception):
    """Base of every error of this package."""


class Sample(NamedTuple):
    """One metric value as a source saw it.

    Attributes:
        rank: The global rank that reported it.
        step: The step as the script numbered it (never renumbered), >= 0.
        key: The metric name (a TensorBoard tag, a protocol key, a regex's name).
        value: The value; NaN and infinities allowed.
        wall_time: When it was written (seconds since the epoch), as well as it is known.
    """

    rank: int
    step: int
    key: str
    value: float
    wall_time: float


def to_rows(samples: list[Sample], run_id: int, attempt: int) -> list[dict]:
    """The rows ``db.metricstore.write_points`` takes, for one attempt of one run."""
    return [{"run_id": run_id, "attempt": attempt, "rank": s.rank, "step": s.step, "key": s.key, "value": s.value,
             "wall_time": s.wall_time} for s in samples]

