"""The metric store's rollups (db/metricstore/rollups.py) on a real SQLite file and a real
PostgreSQL database: they equal what their raw points give at every level, whatever the order
and batching of the points, and totals sum the values that are not NaN.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from db import metricstore
from db.metricstore import BASE, LEVELS, series
from db.models import MetricRollup
from tests.unit.db.metricstore.generated_points import (
    HYPOTHESIS,
    assert_rows_equal,
    close,
    engine,
    expected_buckets,
    kept,
    new_run,
    point,
    to_rows,
    total_of,
    write_in_batches,
)

__all__ = ["engine"]  # the fixtures, from the helper module


pytestmark = pytest.mark.both_dbs


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=200), cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_every_level_equals_its_raw_points(engine: Engine, points: list[tuple], cuts: list[int]) -> None:
    run_id = new_run(engine)
    rows = to_rows(run_id, points)
    write_in_batches(engine, rows, cuts)
    stored = kept(rows)
    with Session(engine) as s:
        for key in ("loss", "lr"):
            for level in range(LEVELS + 1):
                got = series(s, run_id, key, level=level)
                assert got.bucket_steps == BASE**level
                assert_rows_equal(got.rows, expected_buckets(stored, key, level))
                steps = [step for (k, _, _, step) in stored if k == key]
                assert got.max_step == (max(steps) if steps else None)


def rollup_table(engine: Engine, run_id: int) -> list[tuple]:
    R = MetricRollup
    cols = [c for c in R.__table__.columns if c.name != "run_id"]
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(*cols).where(R.run_id == run_id).order_by(*cols[:5]))]


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=150), cuts=st.lists(st.integers(0, 10_000), min_size=1, max_size=8),
       seed=st.integers(0, 2**16))
def test_batches_and_order_give_the_rollups_of_one_batch(engine: Engine, points: list[tuple], cuts: list[int],
                                                         seed: int) -> None:
    # Distinct points, so that "first write wins" does not depend on the order.
    unique = list({(k, a, r, s): (k, a, r, s, v) for k, a, r, s, v in points}.values())
    one, many, together = new_run(engine), new_run(engine), new_run(engine)
    write_in_batches(engine, to_rows(one, unique), [])
    for run_id, one_transaction in ((many, False), (together, True)):  # a batch per transaction, or all in one
        shuffled = to_rows(run_id, unique)
        random.Random(seed).shuffle(shuffled)
        write_in_batches(engine, shuffled, cuts, one_transaction=one_transaction)
    a = rollup_table(engine, one)
    sum_at = list(MetricRollup.__table__.columns.keys()).index("sum_value") - 1
    for b in (rollup_table(engine, many), rollup_table(engine, together)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert x[:sum_at] == y[:sum_at] and x[sum_at + 1:] == y[sum_at + 1:]
            assert (x[sum_at] is None and y[sum_at] is None) or close(x[sum_at], y[sum_at])


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=200), max_step=st.one_of(st.none(), st.integers(0, 5100)))
def test_totals_sum_the_non_nan_values_up_to_a_step(engine: Engine, points: list[tuple], max_step: int | None) -> None:
    run_id = new_run(engine)
    rows = to_rows(run_id, points)
    write_in_batches(engine, rows, [])
    stored = kept(rows)
    with Session(engine) as s:
        for attempt in (1, 2):
            total, count = metricstore.totals(s, run_id, "loss", attempt=attempt, rank=1, max_step=max_step)
            vals = [r["value"] for (k, a, rank, step), r in stored.items()
                    if (k, a, rank) == ("loss", attempt, 1) and (max_step is None or step <= max_step)]
            assert count == sum(not math.isnan(v) for v in vals)
            assert close(total, total_of(vals))
