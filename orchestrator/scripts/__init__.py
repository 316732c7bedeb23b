"""Plain-script support: what runyard sees of, and does for, an unchanged training script.

One module per job:

- ``log_lines``: the ``RUNYARD {...}`` line protocol and the config's stdout regexes, over an
  incremental tailer of the ranks' log files;
- ``tensorboard_events``: TensorBoard event files tailed live (``SummaryWriter``, tensorboardX,
  Lightning), each tag on its own step counter, and ``import_logdir`` for past runs;
- ``metric_collector``: one object per attempt that the scheduler polls, and ``write`` into the
  metric store;
- ``checkpoint_finder``: finds the script's own checkpoint files on disk (the config's glob),
  with their size, time and sha256 (a matched folder is one checkpoint);
- ``checkpoint_steps``: the step a checkpoint holds, where its framework records it (Hugging
  Face's ``trainer_state.json``, a ``torch.save`` dict read by an unpickler that runs nothing,
  numbers in names);
- ``checkpoint_custody``: records each version of those files as a checkpoint row, pins it, and
  hands the right one to the next attempt (the file-level checks it uses, a version still being
  the one recorded and a verified copy, are db/file_versions.py, shared with the SDK);
- ``attempt_watch``: wires the collector and the checkpoint finder into each running attempt
  and watches the script's output for hangs;
- ``allowed_roots``: which scripts and folders a UI user may launch (``ui_fields``: every config
  field by what a UI submission may put in it);
- ``script_check``: a script run checked at submit (its paths made absolute, the ranks'
  interpreter probed for torch and for where ``workload.module`` would load from);
- ``imported_runs``: a past run's TensorBoard logdir brought in as a finished run;
- ``shims/wandb``: a ``wandb`` module for the ranks that prints the line protocol (the launcher
  puts it first on their path: ``with_wandb_shim`` in orchestrator/executors/launcher.py).

Inside the ranks, ``trainer/process/script_runner.py`` starts the script (it stays in trainer/: it
runs under torchrun, possibly under another interpreter without runyard installed).

Every metric source produces :class:`Sample` values; the collector stamps them with the run and
the attempt into the rows ``db.metricstore.write_points`` takes.
"""

from __future__ import annotations

from typing import Any, NamedTuple


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


def to_rows(samples: list[Sample], run_id: int, attempt: int) -> list[dict[str, Any]]:
    """The rows ``db.metricstore.write_points`` takes, for one attempt of one run."""
    return [{"run_id": run_id, "attempt": attempt, "rank": s.rank, "step": s.step, "key": s.key, "value": s.value,
             "wall_time": s.wall_time} for s in samples]

