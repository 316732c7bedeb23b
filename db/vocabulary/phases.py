"""Where an attempt's start-up went, and after a failure, where the recovery went: phases between
marks in time, every mark a wall-clock second of this machine.

The marks, in the order they happen:

- ``failed``: the previous attempt's rank failed (``attempts.failed_at``: the moment torchrun's
  agent saw it, within its 0.1 s monitor interval; else torchrun's exit);
- ``exited``: torchrun stopped the other ranks and exited (``attempts.ended_at``);
- ``detected``: the scheduler saw the exit, swept leftovers and settled it (``detected_at``);
- ``launched``: the next attempt's row, after the retry policy, its backoff and a second sweep
  (``started_at``);
- then rank 0's own marks (``attempts.phase_marks_json``, written by trainer/sdk.py):
  ``spawned`` (its process was created: the shim, torchrun's agent and its rendezvous before),
  ``imported`` (Python and torch imported), ``joined`` (the process group formed),
  ``data`` (data loaded and the model built: the checkpoint load begins),
  ``checkpoint`` (the checkpoint verified and loaded; nothing to load for a fresh start);
- ``first_step``: the first optimizer step completed (``first_step_at``).

A phase runs from one mark to the next present one, so a missing mark (an attempt from before
the marks, a script that never calls ``load_checkpoint``) counts in the phase after it, and the
phases always add up to the time from the first mark to the first step. SQL-free: the read
queries (db/queries.py) and goodput (db/efficiency.py) use it.
"""

from __future__ import annotations

import json
from typing import Any

# (key, the mark it ends at, what a person reads), in the order they happen.
RECOVERY_PHASES: tuple[tuple[str, str, str], ...] = (
    ("teardown", "exited", "torchrun saw the rank fail, stopped the other ranks and exited"),
    ("detect", "detected", "the scheduler saw the exit and settled the attempt"),
    ("relaunch", "launched", "retry policy, backoff and sweep, the next attempt's row"),
)
STARTUP_PHASES: tuple[tuple[str, str, str], ...] = (
    ("launch", "spawned", "the shim and torchrun's agent start, rendezvous and spawn the ranks (a warm start: "
                          "the agent imports torch and the trainer first)"),
    ("import", "imported", "the rank's interpreter starts and imports torch (a warm start: reads its config)"),
    ("rendezvous", "joined", "the ranks form the process group"),
    ("data", "data", "the data is loaded and the model built"),
    ("checkpoint", "checkpoint", "the checkpoint is verified and loaded"),
    ("first_step", "first_step", "the first optimizer step"),
)
PHASE_LABELS: dict[str, str] = {key: text for key, _, text in (*RECOVERY_PHASES, *STARTUP_PHASES)}
RANK_MARKS = ("spawned", "imported", "joined", "data", "checkpoint")


def marks_from_json(text: str | None) -> dict[str, float]:
    """``attempts.phase_marks_json`` read back: {mark: wall-clock seconds}; {} when unset."""
    if not text:
        return {}
    try:
        loaded = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {str(k): float(v) for k, v in loaded.items() if isinstance(v, int | float)}


def _between(start: float, marks: list[tuple[str, str, float | None]]) -> list[dict[str, Any]]:
    """Phases from ``start`` through each present mark; a mark earlier than the one before it (a
    clock read on another host) gives a zero phase, never a negative one."""
    phases, at = [], start
    for key, _, mark in marks:
        if mark is None:
            continue
        seconds = max(0.0, mark - at)
        phases.append({"phase": key, "seconds": seconds, "label": PHASE_LABELS[key]})
        at = max(at, mark)
    return phases


def attempt_phases(attempt: dict[str, Any], previous: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The phases of ``attempt``'s start-up, and of the recovery before it when ``previous``
    failed: ``[{"phase", "seconds", "label"}, ...]`` in order, up to its first step (or to its
    newest mark while it starts). None when it has no mark past its launch yet.

    Args:
        attempt: One of db/queries.attempts_of's dicts (``started_at``, ``first_step_at``,
            ``phase_marks``).
        previous: The attempt before it, or None.
    """
    marks: dict[str, float] = attempt.get("phase_marks") or {}
    rank_marks = [(key, mark, marks.get(mark)) for key, mark, _ in STARTUP_PHASES[:-1]]
    rank_marks.append(("first_step", "first_step", attempt.get("first_step_at")))
    if all(m is None for _, _, m in rank_marks):
        return None
    recovering = previous is not None and previous.get("cause") and previous.get("failed_at") is not None
    if not recovering:
        return _between(attempt["started_at"], rank_marks)
    assert previous is not None
    failed = float(previous["failed_at"])
    before = [("teardown", "exited", previous.get("ended_at")), ("detect", "detected", previous.get("detected_at")),
              ("relaunch", "launched", attempt["started_at"])]
    return _between(failed, [*before, *rank_marks])


def recovery_s(attempt: dict[str, Any], previous: dict[str, Any] | None) -> float | None:
    """Failure of ``previous`` to ``attempt``'s first step (the sum of its phases), or None."""
    if previous is None or not previous.get("cause") or previous.get("failed_at") is None \
            or attempt.get("first_step_at") is None:
        return None
    return max(0.0, float(attempt["first_step_at"]) - float(previous["failed_at"]))
