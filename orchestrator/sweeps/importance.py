"""Which of a sweep's keys mattered: each key's share of a random forest's impurity importance,
fitted to the trials' values against their settings (the sweep page's importance; fANOVA is too
slow for hundreds of trials, a forest of 64 small trees takes a fraction of a second for 300).

Each key becomes one column: a range's values as they are (a ``log_uniform`` key's logarithm, the
scale it is searched on), a choice's as the index of the value among its choices (trees split it
into any groups). A trial without a value, or with NaN, is left out; the value is taken on the
goal's scale, so that "better" is the same direction for every sweep.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from db.vocabulary.config.sweep import SweepConfig

TREES = 64
MIN_TRIALS = 4  # fewer say nothing about importance


def column(sweep: SweepConfig, key: str, value: Any) -> float:
    """A setting as a number for the forest (see the module docstring)."""
    d = sweep.space[key]
    if d.kind == "choice":
        choices = d.values_of("choice") or []
        return float(next((i for i, c in enumerate(choices) if type(c) is type(value) and c == value), -1))
    return math.log(float(value)) if d.kind == "log_uniform" else float(value)


def importance(sweep: SweepConfig, trials: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each key's importance, shares adding up to 1, from ``trials`` (dicts with ``params`` and
    ``value``, as db/sweeps/queries.py gives them); every key 0 with fewer than :data:`MIN_TRIALS`
    valued trials or values that do not vary."""
    from sklearn.ensemble import RandomForestRegressor  # noqa: PLC0415 - scikit-learn only for this page's number

    keys = list(sweep.space)
    rows = [(t["params"], t["value"]) for t in trials
            if t.get("value") is not None and math.isfinite(t["value"]) and all(k in t["params"] for k in keys)]
    zero = dict.fromkeys(keys, 0.0)
    if len(rows) < MIN_TRIALS or len({v for _, v in rows}) < 2:
        return zero
    x = [[column(sweep, k, params[k]) for k in keys] for params, _ in rows]
    y = [v if sweep.goal == "maximize" else -v for _, v in rows]
    forest = RandomForestRegressor(n_estimators=TREES, max_depth=8, min_samples_leaf=2, random_state=0, n_jobs=1)
    forest.fit(x, y)
    shares = [float(s) for s in forest.feature_importances_]
    total = sum(shares)
    return {k: s / total for k, s in zip(keys, shares, strict=True)} if total > 0 else zero
