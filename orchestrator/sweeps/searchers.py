"""The searchers: what trial n tries. Each suggestion is a pure function of the space, the sweep's
seed, n and what the searcher was told of the trials before (``history``, stored with the trial):
never of timing, so a scheduler started again suggests what the one before would have, and a
trial's suggestion can be made again from its row and checked.

- ``grid``: the n-th point of the grid, in its fixed order (orchestrator/sweeps/space.py).
- ``random``: each key drawn independently, from a generator seeded by (seed, n).
- ``tpe``: Optuna's TPE sampler used as a library (ask/tell), on an in-memory study rebuilt from
  the history each time (Optuna's own storage cannot share runyard's database: both keep an
  Alembic ``alembic_version`` table): finished trials told with their objective, pruned ones as
  PRUNED with their values at the rungs, those still training as RUNNING, which its constant liar
  keeps apart from a new suggestion. Optuna is imported only here, and only for a TPE sweep.

A suggestion equal to an earlier trial's (a small discrete space, or TPE settling) is asked again
with the next seed, at most :data:`ASKS` times; None then: the space has nothing new to offer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from db.vocabulary.config.sweep import Dimension, SweepConfig
from orchestrator.sweeps.space import grid_point

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

ASKS = 32

# What the searcher is told a trial came to (``Told.state``).
COMPLETE, PRUNED, RUNNING, FAILED = "complete", "pruned", "running", "failed"


@dataclass(frozen=True)
class Told:
    """One earlier trial as the searcher is told of it: its values, what it came to, its objective
    at its end (``complete``) and at each rung it was judged at, by step."""

    number: int
    params: dict[str, Any]
    state: str  # COMPLETE, PRUNED, RUNNING or FAILED
    value: float | None = None
    rungs: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> list[Any]:
        """As stored in ``sweep_trials.history_json`` (the params are the trial's own row's)."""
        return [self.number, self.state, self.value, {str(step): v for step, v in self.rungs.items()}]


def history_json(history: Sequence[Told]) -> str:
    """What trial n was suggested from, as stored with it."""
    return json.dumps([told.to_json() for told in history])


def history_from_json(text: str, params: dict[int, dict[str, Any]]) -> list[Told]:
    """A stored history back as :class:`Told` (``params``: each trial's values, by number)."""
    return [Told(number, params[number], state, value, {int(step): v for step, v in rungs.items()})
            for number, state, value, rungs in json.loads(text)]


def derived_seed(seed: int, number: int, ask: int) -> int:
    """A 32-bit seed for trial ``number``'s ``ask``-th try, the same in every process."""
    digest = hashlib.sha256(f"{seed}:{number}:{ask}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def params_key(params: dict[str, Any]) -> str:
    """A configuration as a comparable text: two suggestions are the same when their keys are."""
    return json.dumps(params, sort_keys=True)


def draw(d: Dimension, rng: random.Random) -> Any:
    """One random value of a dimension: log-uniform, uniform, a whole number or a choice."""
    values = d.values_of(d.kind) or []
    if d.kind == "choice":
        return values[rng.randrange(len(values))]
    if d.kind == "int":
        return rng.randint(values[0], values[1])
    low, high = float(values[0]), float(values[1])
    if d.kind == "log_uniform":
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    return rng.uniform(low, high)


def random_params(sweep: SweepConfig, seed: int, number: int, ask: int) -> dict[str, Any]:
    """Trial ``number``'s ``ask``-th random draw: each key in the space's order."""
    rng = random.Random(derived_seed(seed, number, ask))  # noqa: S311 - a search, not a secret: seeded to replay
    return {key: draw(d, rng) for key, d in sweep.space.items()}


def distributions(sweep: SweepConfig) -> dict[str, BaseDistribution]:
    """The space as Optuna's distributions."""
    from optuna.distributions import (  # noqa: PLC0415 - Optuna only for a TPE sweep: the CLI starts without it
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, BaseDistribution] = {}
    for key, d in sweep.space.items():
        values = d.values_of(d.kind) or []
        if d.kind == "choice":
            out[key] = CategoricalDistribution(values)
        elif d.kind == "int":
            out[key] = IntDistribution(values[0], values[1])
        else:
            out[key] = FloatDistribution(float(values[0]), float(values[1]), log=d.kind == "log_uniform")
    return out


def tpe_params(sweep: SweepConfig, seed: int, number: int, ask: int, history: Sequence[Told]) -> dict[str, Any]:
    """Trial ``number``'s ``ask``-th TPE suggestion, from an in-memory study told ``history``."""
    import optuna  # noqa: PLC0415 - Optuna only for a TPE sweep: the CLI and the scheduler start without it
    from optuna.trial import TrialState, create_trial  # noqa: PLC0415 - as above

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").propagate = False  # its "trial finished" lines are not runyard's log
    space = distributions(sweep)
    sampler = optuna.samplers.TPESampler(seed=derived_seed(seed, number, ask), constant_liar=True)
    study = optuna.create_study(sampler=sampler, direction=sweep.goal)
    for told in sorted(history, key=lambda t: t.number):
        usable = told.value is not None and math.isfinite(told.value)
        if told.state == COMPLETE and usable:
            study.add_trial(create_trial(params=told.params, distributions=space, value=told.value))
        elif told.state == PRUNED:
            steps = {step: v for step, v in told.rungs.items() if v is not None and math.isfinite(v)}
            study.add_trial(create_trial(params=told.params, distributions=space, state=TrialState.PRUNED,
                                         intermediate_values=steps))
        elif told.state == RUNNING:
            study.add_trial(create_trial(params=told.params, distributions=space, state=TrialState.RUNNING))
        else:  # failed, refused, or finished without a value
            study.add_trial(create_trial(params=told.params, distributions=space, state=TrialState.FAIL))
    return dict(study.ask(space).params)


def suggest(sweep: SweepConfig, seed: int, number: int, history: Sequence[Told],
            taken: Collection[str] = ()) -> dict[str, Any] | None:
    """Trial ``number``'s values: the searcher's suggestion, asked again (up to :data:`ASKS` times)
    while it equals one of ``taken`` (the earlier trials' :func:`params_key`); None when the space
    has nothing new (a grid past its last point, or every try a repeat).

    Args:
        sweep: The ``[sweep]`` section (its space, searcher and goal).
        seed: The sweep's seed.
        number: The trial's number (0-based).
        history: What the searcher is told of the trials before it (TPE's; the others need none).
        taken: The configurations tried already.
    """
    if sweep.searcher == "grid":
        return grid_point(sweep, number)
    for ask in range(ASKS):
        params = (tpe_params(sweep, seed, number, ask, history) if sweep.searcher == "tpe"
                  else random_params(sweep, seed, number, ask))
        if params_key(params) not in taken:
            return params
    return None
