"""[sweep]: a search over a run config's keys (docs/SWEEPS.md).

A sweep file is an ordinary run config, the base of every trial, plus this section: what to
search (``[sweep.space]``, keyed by the config key each dimension sets), how (``searcher``), what
for (``metric`` and ``goal``), how many at once, when to stop a trial early
(``[sweep.early_stop]``) and what the whole sweep may spend (``[sweep.budget]``). Each trial is an
ordinary run: the base config with the trial's values, stored without this section.

What this model checks is each dimension on its own (one kind, bounds in order, a log range above
0, a choice without repeats) and the section's own values; whether a key exists in the base config
and takes the dimension's values is judged against the base (orchestrator/sweeps/space.py), as are
the rungs the early stop and the checkpoint cadence give.
"""

from __future__ import annotations

import math
from typing import Any, Literal, cast

from pydantic import ConfigDict, Field, field_validator, model_validator

from db.vocabulary.config.base import INT64_MAX, PROBLEM_SEPARATOR, SEED_MAX, _Section

# A value a choice may offer: what a TOML key of a run config holds.
Choice = str | bool | int | float

# The kinds of dimension, in the order docs/SWEEPS.md explains them.
KINDS = ("log_uniform", "uniform", "int", "choice")
# A grid of a continuous range takes this many points at most (a grid is a product: ten keys of
# ten points is already 10^10 trials, which max_trials cuts anyway).
MAX_POINTS = 1000
# The most trials a sweep may ask for: every trial is a run row, a folder and a searcher's history.
MAX_TRIALS = 10_000


class Dimension(_Section):
    """One key of the space: exactly one of `log_uniform`, `uniform`, `int` or `choice`."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, validate_default=True, populate_by_name=True,
        strict=True,
    )

    log_uniform: list[float] | None = Field(default=None, min_length=2, max_length=2)
    """`[low, high]`, both above 0: values spread evenly on a log scale (learning rates, weight
    decay)."""

    uniform: list[float] | None = Field(default=None, min_length=2, max_length=2)
    """`[low, high]`: values spread evenly between the two."""

    int_range: list[int] | None = Field(default=None, min_length=2, max_length=2, alias="int")
    """`[low, high]`: whole numbers from low to high, both included (widths, batch sizes). Key:
    `int`."""

    choice: list[Choice] | None = Field(default=None, min_length=1)
    """The values to choose from, each of the key's own type (`[32, 64, 128]`, `["cosine",
    "constant"]`), none repeated."""

    points: int | None = Field(default=None, ge=2, le=MAX_POINTS)
    """For `searcher = "grid"` over a `uniform` or `log_uniform` range: this many values from low
    to high, both included, evenly spaced (log-spaced for `log_uniform`). A grid needs it for
    every continuous range; `int` and `choice` give their own values."""

    @property
    def kind(self) -> str:
        """Which of :data:`KINDS` this dimension is (the one set)."""
        return next(kind for kind in KINDS if self.values_of(kind) is not None)

    def values_of(self, kind: str) -> list[Any] | None:
        """What the dimension gives for ``kind`` (``"int"`` is :attr:`int_range`), or None."""
        return cast("list[Any] | None", getattr(self, "int_range" if kind == "int" else kind))

    @model_validator(mode="after")
    def _one_kind(self) -> Dimension:
        """Exactly one kind, its bounds in order, a log range above 0, no repeated choice: every
        problem at once."""
        if problems := dimension_problems(self):
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self


def dimension_problems(d: Dimension) -> list[str]:
    """What is wrong with one dimension on its own, every problem (each says the kind and the value)."""
    given = [kind for kind in KINDS if d.values_of(kind) is not None]
    if len(given) != 1:
        kinds = ", ".join(f"`{kind}`" for kind in KINDS)
        return [f"give exactly one of {kinds} (here: {', '.join(given) or 'none'})"]
    kind = given[0]
    values = d.values_of(kind) or []
    problems = []
    if kind in ("log_uniform", "uniform") and not all(math.isfinite(v) for v in values):
        return [f"{kind} = {values!r}: the bounds must be finite numbers"]
    if kind in ("log_uniform", "uniform", "int") and values[0] >= values[1] and not (kind == "int"
                                                                                     and values[0] == values[1]):
        problems.append(f"{kind} = {values!r}: the low bound must be below the high one")
    if kind == "log_uniform" and min(values) <= 0:
        problems.append(f"log_uniform = {values!r}: a log range needs both bounds above 0")
    if kind == "choice":
        seen: list[tuple[type, Choice]] = []
        for value in values:
            if (type(value), value) in seen:  # 1 and 1.0 and True are three values
                problems.append(f"choice = {values!r}: {value!r} is given twice")
            seen.append((type(value), value))
    if d.points is not None and kind not in ("uniform", "log_uniform"):
        problems.append(f"points = {d.points}: only a `uniform` or `log_uniform` range takes points; "
                        f"`{kind}` gives its own values")
    return problems


class EarlyStopConfig(_Section):
    """Stopping the trials that fall behind (ASHA, docs/SWEEPS.md): at each rung, a trial whose
    objective is not among the best `1/reduction` of those recorded there stops gracefully (it
    checkpoints) and ends PRUNED; a pruned trial that later ranks among them is promoted and
    continues from its checkpoint."""

    kind: Literal["asha"] = "asha"
    """`asha`: asynchronous successive halving, decided by runyard at checkpoints, outside the
    ranks."""

    reduction: int = Field(default=3, ge=2, le=100)
    """How many trials reach a rung for each that passes it: 3 keeps the best third."""

    min_steps: int = Field(default=100, ge=1, le=INT64_MAX)
    """The first rung's step; rung k is at `min_steps x reduction^k`, each below the base
    config's step count (`train.max_steps`, or `workload.max_steps` for a script) and, for a
    built-in workload, rounded up to a multiple of `checkpoint.every_steps`, where a verified
    checkpoint exists."""


class BudgetConfig(_Section):
    """What the whole sweep may spend: once one limit is reached, no trial starts or is promoted,
    and the trials still training stop gracefully at once (each checkpoints and ends PRUNED, to
    be promoted by hand later). 0: no limit."""

    gpu_hours: float = Field(default=0.0, ge=0, allow_inf_nan=False, title="GPU-hours")
    """Device time of every trial's attempts (each attempt's duration times its GPUs; on a CPU
    machine its CPU slots)."""

    usd: float = Field(default=0.0, ge=0, allow_inf_nan=False, title="Dollars")
    """The trials' cost, as each run's cost line says (its price per hour times its attempts'
    time)."""

    wall_hours: float = Field(default=0.0, ge=0, allow_inf_nan=False, title="Wall time (hours)")
    """Hours since the sweep started."""

    max_failed: int = Field(default=3, ge=0, le=INT64_MAX, title="Breaker: same failure")
    """The breaker: when this many trials failed with the same error (the retry policy's repeated
    error signature: the exception line, volatile parts aside), the sweep stops and says which
    (0: never)."""


class SweepConfig(_Section):
    """A sweep over this config (`runyard sweep start FILE`, docs/SWEEPS.md): the rest of the file
    is the base of every trial."""

    metric: str = Field(default="eval_loss", min_length=1, max_length=100)
    """The objective: any metric the trials record (`eval_loss`, `eval_accuracy`, `loss`, a
    script's own), read at the largest step logged at or before the step that matters."""

    goal: Literal["minimize", "maximize"] = "minimize"
    """Whether a lower (`minimize`) or higher (`maximize`) objective is better."""

    ranks: Literal["rank0", "mean"] = "rank0"
    """Whose value of the metric: rank 0's, or the mean over the ranks that logged it at that step."""

    searcher: Literal["grid", "random", "tpe"] = "random"
    """`grid`: every combination, in a fixed order (the space's keys as written, the first
    slowest); `random`: each trial drawn independently, seeded; `tpe`: Optuna's Tree-structured
    Parzen Estimator, told every finished and pruned trial (and the running ones, so that trials
    started together differ)."""

    max_trials: int = Field(default=10, ge=1, le=MAX_TRIALS)
    """The most trials to start (a grid stops sooner when it has none left). May be changed while
    the sweep runs (`runyard sweep edit`)."""

    max_concurrent: int = Field(default=1, ge=1, le=1024)
    """The most trials training (queued, running or stopping) at once; each still waits for its
    devices like any run. May be changed while the sweep runs."""

    seed: int = Field(default=0, ge=0, le=SEED_MAX)
    """Seed of the searcher: trial n's suggestion depends on it, on n and on the results the
    searcher was told, never on timing."""

    # The New sweep form edits the space in a box of its own (app/views/new_sweep.py).
    space: dict[str, Dimension] = Field(default_factory=dict, json_schema_extra={"own_form": True})
    """The search space (`[sweep.space]`), keyed by the config key each dimension sets, quoted:
    `"train.lr" = {log_uniform = [1e-4, 1e-2]}`, `"workload.hidden" = {choice = [64, 128, 256]}`."""

    early_stop: EarlyStopConfig | None = None
    """`[sweep.early_stop]`: stop trials that fall behind at checkpoints (none: every trial runs to
    its end)."""

    budget: BudgetConfig = BudgetConfig()
    """`[sweep.budget]`: what the sweep may spend, and the breaker."""

    @field_validator("space")
    @classmethod
    def _keys(cls, space: dict[str, Dimension]) -> dict[str, Dimension]:
        if not space:
            raise ValueError("the space is empty: give at least one key, e.g. \"train.lr\" = "
                             "{log_uniform = [1e-4, 1e-2]}")
        problems = [problem for key in space if (problem := space_key_problem(key))]
        if problems:
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return space


def space_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a key of the space on its face (not a dotted config key, or one a
    sweep sets itself), or None; whether the base config has it is judged against the base."""
    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        return f"{key!r}: not a config key; write the section and the key, e.g. \"train.lr\""
    if parts[0] == "sweep":
        return f"{key!r}: a sweep cannot search its own settings"
    return None
