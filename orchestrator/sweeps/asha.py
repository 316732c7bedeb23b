"""Asynchronous successive halving (ASHA), decided by runyard at verified checkpoints: pure functions
over plain values.

Rungs: rung k is at ``min_steps x reduction^k`` below the trial's step count, each rounded up to a
step where a verified checkpoint will exist (a multiple of ``checkpoint.every_steps`` for the
built-in workloads; a script's cadence is its own, so its value at a rung is taken at its first
verified checkpoint at or past the rung's step: orchestrator/sweeps/objective.py).

At a rung a trial is judged once, against the values recorded at that rung so far, itself
included (:func:`judge`): with fewer than ``reduction`` of them it continues; otherwise it continues
when its value is at least as good as the cut, the ``1 - 1/reduction`` quantile of those values
on the goal's scale (the best third, for 3), and is stopped early (PRUNED) when not. A pruned
trial that later ranks among the best ``floor(n / reduction)`` of the ``n`` values at its rung is
promoted (:func:`promotable`): it continues from its checkpoint. A value that is missing or NaN
ranks last.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from db.vocabulary.config import RunConfig, ScriptWorkload
from db.vocabulary.config.sweep import EarlyStopConfig

Value = float | None


def round_up(step: int, every: int) -> int:
    """``step`` rounded up to a multiple of ``every`` (``every`` 0 or 1: itself)."""
    return step if every <= 1 else -(-step // every) * every


def rungs(early_stop: EarlyStopConfig, max_steps: int, every: int) -> list[int]:
    """The rungs' steps, ascending and distinct: ``min_steps x reduction^k`` rounded up to a
    multiple of ``every`` (the checkpoint cadence; 0 where the trial's own cadence decides), each
    below ``max_steps`` (the last step is the trial's end, not a rung)."""
    found: list[int] = []
    k = 0
    while (nominal := early_stop.min_steps * early_stop.reduction ** k) < max_steps:
        step = round_up(nominal, every)
        if step >= max_steps:
            break
        if not found or step > found[-1]:
            found.append(step)
        k += 1
    return found


def trial_steps(base: RunConfig) -> int:
    """How many steps a trial of ``base`` trains (0: a script that says nothing of it)."""
    return base.workload.max_steps if isinstance(base.workload, ScriptWorkload) else base.train.max_steps


def cadence(base: RunConfig) -> int:
    """The checkpoint cadence the rungs are rounded to: ``checkpoint.every_steps`` for a built-in
    workload, 0 for a script (its first verified checkpoint at or past a rung is taken)."""
    return 0 if isinstance(base.workload, ScriptWorkload) else base.checkpoint.every_steps


def base_rungs(base: RunConfig, early_stop: EarlyStopConfig | None) -> list[int]:
    """The rungs of a sweep over ``base`` (none without an early stop)."""
    return rungs(early_stop, trial_steps(base), cadence(base)) if early_stop is not None else []


def rung_problems(base: RunConfig, early_stop: EarlyStopConfig | None) -> list[str]:
    """Why the early stop and the base's length and checkpoint cadence can give no rung, naming
    the keys; empty when they can (or there is no early stop)."""
    if early_stop is None:
        return []
    script = isinstance(base.workload, ScriptWorkload)
    steps_key = "workload.max_steps" if script else "train.max_steps"
    if trial_steps(base) == 0:
        return [f"sweep.early_stop needs {steps_key}: the rungs lie below a trial's last step (0: unknown)"]
    if not script and base.checkpoint.every_steps == 0:
        return ["sweep.early_stop needs checkpoint.every_steps > 0: a rung is judged, and a stopped trial "
                "continued, at a verified checkpoint"]
    if not base_rungs(base, early_stop):
        rounded = "" if script else f" rounded up to checkpoint.every_steps = {base.checkpoint.every_steps}"
        return [f"sweep.early_stop.min_steps = {early_stop.min_steps}{rounded} gives no rung below "
                f"{steps_key} = {trial_steps(base)}: lower min_steps (or save checkpoints more often)"]
    return []


# -- judging a trial at a rung ----------------------------------------------------------------


def score(value: Value, goal: str) -> float:
    """``value`` on a scale where higher is better: itself to maximize, negated to minimize; a
    missing or NaN value is the worst of all."""
    if value is None or math.isnan(value):
        return -math.inf
    return value if goal == "maximize" else -value


def quantile(scores: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``scores`` with linear interpolation between the two nearest (numpy's
    default); between -inf (no value) and a value, the value."""
    ordered = sorted(scores)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    if low == high or ordered[low] == ordered[high]:
        return ordered[low]
    if math.isinf(ordered[low]):  # between no value and a value: the value (interpolating gives NaN)
        return ordered[high]
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cut(values: Sequence[Value], reduction: int, goal: str) -> float | None:
    """The cut of a rung on the goal's scale (:func:`score`): the ``1 - 1/reduction`` quantile of
    its values; None with fewer than ``reduction`` values (every trial then continues)."""
    if len(values) < reduction:
        return None
    return quantile([score(v, goal) for v in values], 1 - 1 / reduction)


def unscore(cut_score: float | None, goal: str) -> float | None:
    """A cut back on the metric's own scale (None stays None; -inf is None: no value passes)."""
    if cut_score is None or math.isinf(cut_score):
        return None
    return cut_score if goal == "maximize" else -cut_score


class Verdict(Enum):
    """What a trial's value at a rung decides; the value is the sentence."""

    FEW = "fewer than {reduction} values at rung {rung}: it continues"
    CONTINUES = "{value} is at least as good as the cut {cut} at rung {rung}: it continues"
    PRUNED = "{value} is not as good as the cut {cut} at rung {rung}: it is stopped early"

    @property
    def prunes(self) -> bool:
        return self is Verdict.PRUNED


@dataclass(frozen=True)
class Judged:
    """A trial judged at a rung: the verdict, and the cut on the metric's scale (None: no cut)."""

    verdict: Verdict
    cut: float | None

    def words(self, value: Value, rung: int, reduction: int) -> str:
        shown = "no value" if value is None or math.isnan(value) else f"{value:.6g}"
        cut_words = "none" if self.cut is None else f"{self.cut:.6g}"
        return self.verdict.value.format(value=shown, cut=cut_words, rung=rung, reduction=reduction)


def judge(value: Value, values: Sequence[Value], reduction: int, goal: str) -> Judged:
    """A trial's value at a rung against ``values``, every value recorded at that rung (its own
    included): it continues while there are fewer than ``reduction`` of them, or when it is at
    least as good as the cut; else it is stopped early."""
    threshold = cut(values, reduction, goal)
    if threshold is None:
        return Judged(Verdict.FEW, None)
    own = score(value, goal)
    continues = own >= threshold and own > -math.inf  # no value is judged worst: it never passes a cut
    return Judged(Verdict.CONTINUES if continues else Verdict.PRUNED, unscore(threshold, goal))


def keep(n: int, reduction: int) -> int:
    """How many of ``n`` values at a rung may go on from it: ``floor(n / reduction)``."""
    return n // reduction


def promotable(value: Value, values: Sequence[Value], reduction: int, goal: str) -> bool:
    """Whether a trial stopped at a rung with ``value`` now ranks among the best
    ``floor(n / reduction)`` of the rung's ``n`` values (``values``, its own included); ties with
    the last kept value count as kept, a missing value never does."""
    n = keep(len(values), reduction)
    if n == 0 or score(value, goal) == -math.inf:
        return False
    ranked = sorted((score(v, goal) for v in values), reverse=True)
    return score(value, goal) >= ranked[n - 1]
