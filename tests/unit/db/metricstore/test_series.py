"""A chart's series from the metric store (db/metricstore/series.py) on a real SQLite file and a
real PostgreSQL database: within max_points, and since_step re-fetches exactly the newest
buckets.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from db import metricstore
from db.metricstore import LEVELS, series
from tests.unit.db.metricstore.generated_points import (
    HYPOTHESIS,
    assert_rows_equal,
    engine,
    kept,
    new_run,
    point,
    to_rows,
    write_in_batches,
)

__all__ = ["engine"]  # the fixtures, from the helper module


pytestmark = pytest.mark.both_dbs


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=200), max_points=st.integers(1, 60))
def test_series_stays_within_max_points(engine: Engine, points: list[tuple], max_points: int) -> None:
    run_id = new_run(engine)
    rows = to_rows(run_id, points)
    write_in_batches(engine, rows, [])
    stored = kept(rows)
    with Session(engine) as s:
        got = series(s, run_id, "loss", max_points=max_points)
    per_series: dict[tuple[int, int], int] = {}
    for r in got.rows:
        per_series[(r["attempt"], r["rank"])] = per_series.get((r["attempt"], r["rank"]), 0) + 1
    assert all(n <= max_points for n in per_series.values())
    points_per_series: dict[tuple[int, int], int] = {}
    for (k, a, r, _) in stored:
        if k == "loss":
            points_per_series[(a, r)] = points_per_series.get((a, r), 0) + 1
    if all(n <= max_points for n in points_per_series.values()):
        assert got.level == 0  # a short run is drawn from its raw points
    assert sum(r["count"] for r in got.rows) == sum(points_per_series.values())


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=200), since=st.integers(0, 5100), level=st.integers(0, LEVELS))
def test_since_step_returns_the_same_rows_as_a_full_fetch(engine: Engine, points: list[tuple], since: int,
                                                          level: int) -> None:
    run_id = new_run(engine)
    write_in_batches(engine, to_rows(run_id, points), [])
    with Session(engine) as s:
        full = series(s, run_id, "lr", level=level)
        newest = series(s, run_id, "lr", level=level, since_step=since)
        auto = series(s, run_id, "lr", max_points=7)
        auto_newest = series(s, run_id, "lr", max_points=7, since_step=since)
    assert_rows_equal(newest.rows, [r for r in full.rows if r["last_step"] >= since])
    assert auto_newest.level == auto.level
    assert_rows_equal(auto_newest.rows, [r for r in auto.rows if r["last_step"] >= since])


def test_a_live_chart_refetches_only_the_newest_bucket(engine: Engine) -> None:
    run_id = new_run(engine)
    rows = [{"run_id": run_id, "key": "loss", "attempt": 1, "rank": r, "step": s, "value": 1.0 / s, "wall_time": s}
            for s in range(1, 1001) for r in range(8)]
    write_in_batches(engine, rows, [])
    with Session(engine) as s:
        full = series(s, run_id, "loss", max_points=100)
        # 1000 points > 100, 251 buckets of 4 > 100, 63 buckets of 16 <= 100.
        assert full.level == 2 and full.bucket_steps == 16 and full.max_step == 1000
        assert len(full.rows) == 8 * 63
        newest = series(s, run_id, "loss", level=full.level, since_step=full.rows[-1]["step"])
    assert [(r["rank"], r["step"], r["count"]) for r in newest.rows] == [(r, 992, 9) for r in range(8)]


def test_an_unknown_key_or_run_is_an_empty_series(engine: Engine) -> None:
    run_id = new_run(engine)
    with Session(engine) as s:
        got = series(s, run_id, "loss")
        assert (got.level, got.bucket_steps, got.rows, got.max_step) == (0, 1, [], None)
        assert metricstore.latest(s, run_id) == {} and metricstore.metric_keys(s, run_id) == []
        assert metricstore.totals(s, run_id, "loss", attempt=1, rank=0) == (0.0, 0)
