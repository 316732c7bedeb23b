"""How a batch of metric points becomes rollup rows, and the upsert that merges them into the
stored buckets (the rules are in db/metricstore/__init__.py's docstring).

Level 1 is summed up from the batch's points, each higher level from the level below, with
numpy: a row is (run, name id, level, attempt, bucket, rank, min, max, sum, count, nan_count,
first step, last step, first time, last time, last value), ``ROLLUP_COLUMNS`` order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, func

if TYPE_CHECKING:
    import numpy as np
    from sqlalchemy.dialects import postgresql, sqlite

from db import DatabaseError
from db.models import MetricRollup

# Buckets of 4**level steps for levels 1..10: the coarsest holds 1,048,576 steps.
BASE = 4
LEVELS = 10
ROLLUP_COLUMNS = ("run_id", "name_id", "level", "attempt", "bucket", "rank", "min_value", "max_value", "sum_value",
                  "count", "nan_count", "first_step", "last_step", "first_time", "last_time", "last_value")

# A point while it is written: (run, name id, attempt, step, rank, value or None, wall time), the
# first five being its key in the table's order.
Point = tuple[int, int, int, int, int, float | None, float]


class MetricStoreError(DatabaseError):
    """The metric store cannot do what was asked (for example, an unsupported database)."""


@dataclass
class BatchRollups:
    """Every level's partial rollups of one batch of new points.

    Attributes:
        rows: Rows in ``ROLLUP_COLUMNS`` order, levels 1..``LEVELS``. A sum that met +Inf and
            -Inf is a float NaN (SQLite stores NULL); min, max and last are None for NaN.
        repeated: Some point (run, name, attempt, step, rank) appears more than once (the
            rows are then not to be used: drop the repeats and summarize again).
        step_ranges: (run, attempt) -> (smallest, largest) step of the batch.
        key_ranges: (smallest, largest) value of each integer column of the points (``run_id``,
            ``name_id``, ``attempt``, ``rank``, ``step``), for a database whose integers are
            narrower than Python's.
    """

    rows: list[tuple[Any, ...]]
    repeated: bool
    step_ranges: dict[tuple[int, int], tuple[int, int]]
    key_ranges: dict[str, tuple[int, int]]


def summarize(run: Sequence[int], name: Sequence[int], attempt: Sequence[int], step: Sequence[int],
              rank: Sequence[int], value: Sequence[float | None], wall: Sequence[float]) -> BatchRollups:
    """The rollup rows of a batch of points given as columns (value None for NaN), computed with
    numpy.

    The points are sorted by (run, name, attempt, rank, step); a bucket of every level is then
    a contiguous slice, and each level is reduced from the level below's partials.
    """
    import numpy as np  # noqa: PLC0415 - numpy only to write metrics: `runyard submit` need not load it

    n = len(step)
    cols = [np.array(c, dtype=np.int64) for c in (run, name, attempt, rank, step)]
    order = np.lexsort(cols[::-1])
    run_a, name_a, attempt_a, rank_a, step_a = (c[order] for c in cols)
    value_a = np.array(value, dtype=np.float64)[order]  # None -> NaN
    wall_a = np.array(wall, dtype=np.float64)[order]
    new_series = np.ones(n, dtype=bool)
    new_series[1:] = ((run_a[1:] != run_a[:-1]) | (name_a[1:] != name_a[:-1]) | (attempt_a[1:] != attempt_a[:-1])
                      | (rank_a[1:] != rank_a[:-1]))
    repeated = bool(np.any(~new_series[1:] & (step_a[1:] == step_a[:-1])))
    nan = np.isnan(value_a)
    level: dict[str, np.ndarray] = {
        "run": run_a, "name": name_a, "attempt": attempt_a, "rank": rank_a, "bucket": step_a, "new": new_series,
        # NaN stands out of min, max and sum as their identities; count - nans says whether any value is left.
        "min": np.where(nan, np.inf, value_a), "max": np.where(nan, -np.inf, value_a),
        "sum": np.where(nan, 0.0, value_a), "count": np.ones(n, dtype=np.int64), "nans": nan.astype(np.int64),
        "first_step": step_a, "last_step": step_a, "first_time": wall_a, "last_time": wall_a, "last": value_a,
    }
    rows: list[tuple[Any, ...]] = []
    with np.errstate(invalid="ignore"):  # +Inf + -Inf is NaN, as it should be
        for number in range(1, LEVELS + 1):
            level = _coarser(level)
            rows.extend(_level_rows(number, level))
    key_ranges = {key: (int(c.min()), int(c.max()))
                  for key, c in zip(("run_id", "name_id", "attempt", "rank", "step"), cols, strict=True)}
    return BatchRollups(rows=rows, repeated=repeated, step_ranges=_step_ranges(run_a, attempt_a, step_a),
                        key_ranges=key_ranges)


def _coarser(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The partials of buckets 4 times wider than those of ``p`` (the same rules as the upsert
    in :func:`rollup_upsert`)."""
    import numpy as np  # noqa: PLC0415 - numpy only to write metrics

    bucket = p["bucket"] // BASE
    new = p["new"].copy()
    new[1:] |= bucket[1:] != bucket[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(bucket)) - 1
    return {
        "run": p["run"][starts], "name": p["name"][starts], "attempt": p["attempt"][starts],
        "rank": p["rank"][starts], "bucket": bucket[starts], "new": p["new"][starts],
        "min": np.minimum.reduceat(p["min"], starts), "max": np.maximum.reduceat(p["max"], starts),
        "sum": np.add.reduceat(p["sum"], starts), "count": np.add.reduceat(p["count"], starts),
        "nans": np.add.reduceat(p["nans"], starts),
        "first_step": p["first_step"][starts], "last_step": p["last_step"][ends],
        "first_time": p["first_time"][starts], "last_time": p["last_time"][ends], "last": p["last"][ends],
    }


def _level_rows(number: int, p: dict[str, np.ndarray]) -> list[tuple[Any, ...]]:
    import numpy as np  # noqa: PLC0415 - numpy only to write metrics

    empty = p["count"] == p["nans"]  # no non-NaN value: min and max are NULL
    low, high, last = p["min"].astype(object), p["max"].astype(object), p["last"].astype(object)
    low[empty] = None
    high[empty] = None
    last[np.isnan(p["last"])] = None
    # strict=False: repeat() never ends; the arrays all have one length.
    return list(zip(
        p["run"].tolist(), p["name"].tolist(), repeat(number), p["attempt"].tolist(), p["bucket"].tolist(),
        p["rank"].tolist(), low.tolist(), high.tolist(), p["sum"].tolist(), p["count"].tolist(), p["nans"].tolist(),
        p["first_step"].tolist(), p["last_step"].tolist(), p["first_time"].tolist(), p["last_time"].tolist(),
        last.tolist(),
        strict=False,
    ))


def _step_ranges(run: np.ndarray, attempt: np.ndarray, step: np.ndarray) -> dict[tuple[int, int], tuple[int, int]]:

    if run[0] == run[-1] and attempt[0] == attempt[-1] and (run == run[0]).all() and (attempt == attempt[0]).all():
        return {(int(run[0]), int(attempt[0])): (int(step.min()), int(step.max()))}
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for r, a, s in zip(run.tolist(), attempt.tolist(), step.tolist(), strict=True):
        lo, hi = out.get((r, a), (s, s))
        out[(r, a)] = (min(lo, s), max(hi, s))
    return out


def dialect_insert(dialect: str) -> Callable[..., sqlite.Insert | postgresql.Insert]:
    """The dialect's own ``insert()``, which has ON CONFLICT."""
    if dialect == "sqlite":
        from sqlalchemy.dialects import sqlite  # noqa: PLC0415 - only the dialect in use (50 ms each)

        return sqlite.insert
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql  # noqa: PLC0415 - only the dialect in use (50 ms each)

        return postgresql.insert
    raise MetricStoreError(f"the metric store supports sqlite and postgresql, not {dialect!r}")


def rollup_upsert(dialect: str) -> sqlite.Insert | postgresql.Insert:
    """INSERT ... ON CONFLICT DO UPDATE that merges a partial into a stored bucket."""
    return merge_rollups(dialect_insert(dialect)(MetricRollup.__table__), dialect)


def merge_rollups(stmt: sqlite.Insert | postgresql.Insert, dialect: str) -> sqlite.Insert | postgresql.Insert:
    """``stmt`` (the dialect's INSERT into metric_rollups, of VALUES or of a SELECT) with the
    ON CONFLICT DO UPDATE that merges each new partial into its stored bucket."""
    t = MetricRollup.__table__
    new = stmt.excluded
    # SQLite's two-argument min()/max() are NULL when either side is; PostgreSQL's least() and
    # greatest() skip NULLs. coalesce() makes both skip them.
    least, greatest = (func.min, func.max) if dialect == "sqlite" else (func.least, func.greatest)
    newer = new.last_step >= t.c.last_step
    older = new.first_step < t.c.first_step
    return stmt.on_conflict_do_update(
        index_elements=list(t.primary_key),
        set_={
            "min_value": func.coalesce(least(t.c.min_value, new.min_value), t.c.min_value, new.min_value),
            "max_value": func.coalesce(greatest(t.c.max_value, new.max_value), t.c.max_value, new.max_value),
            "sum_value": t.c.sum_value + new.sum_value,  # NULL (NaN) stays NULL
            "count": t.c["count"] + new["count"],
            "nan_count": t.c.nan_count + new.nan_count,
            "first_step": least(t.c.first_step, new.first_step),
            "first_time": case((older, new.first_time), else_=t.c.first_time),
            "last_step": greatest(t.c.last_step, new.last_step),
            "last_time": case((newer, new.last_time), else_=t.c.last_time),
            "last_value": case((newer, new.last_value), else_=t.c.last_value),
        },
    )
