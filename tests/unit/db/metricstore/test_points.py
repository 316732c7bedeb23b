"""The metric store's reads other than a chart's series (db/metricstore/points.py): the newest
points of many series at once equal each series' own, across the UNION statements they take; the
NaN points of a run, every metric, counted along its lineage as the points themselves say.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from bench.bench_runs_list import seed_runs
from db import metricstore
from db.models import Attempt
from db.vocabulary.settings import Settings
from tests.unit.db.metricstore.generated_points import (
    HYPOTHESIS,
    engine,
    kept,
    new_run,
    point,
    to_rows,
    write_in_batches,
)

__all__ = ["engine"]  # the fixture, from the helper module

pytestmark = pytest.mark.both_dbs


def test_recent_many_equals_recent_for_each_series(settings: Settings, sessions: sessionmaker[Session],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with sessions() as s:
        seed_runs(s, settings.runs_dir, 12)
        s.commit()
    with sessions() as s:
        series = [(a.run_id, a.number, rank) for a in s.scalars(select(Attempt)) for rank in (0, 1, 5)]
        series.append((999, 1, 0))  # no such run: no points
        expected = {k: metricstore.recent(s, k[0], "loss", attempt=k[1], rank=k[2], limit=3) for k in series}
        assert metricstore.recent_many(s, "loss", series, limit=3) == expected
        assert metricstore.recent_many(s, "no-such-metric", series[:2], limit=3) == {k: [] for k in series[:2]}
        assert metricstore.recent_many(s, "loss", [], limit=3) == {}
        monkeypatch.setattr("db.metricstore.points._UNION_PARTS", 4)  # several UNION statements, same answer
        assert metricstore.recent_many(s, "loss", series, limit=3) == expected
    assert any(len(points) == 3 for points in expected.values())  # the limit mattered


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=200),
       cutoff=st.one_of(st.none(), st.integers(0, 80), st.integers(0, 5100), st.just(math.inf)))
def test_nan_count_counts_every_metric_along_the_lineage(engine: Engine, points: list[tuple],
                                                         cutoff: float | None) -> None:
    """Every metric's NaN points on every rank, those attempt 1 logged after its cutoff (the
    step attempt 2 resumed from) left out, from the rollups as from the points themselves."""
    run_id, other = new_run(engine), new_run(engine)
    rows = to_rows(run_id, points)
    write_in_batches(engine, [*rows, *to_rows(other, points)], [len(rows)])  # another run's NaNs are its own
    cutoffs = {} if cutoff is None else {1: cutoff, 2: math.inf}
    want = sum(math.isnan(r["value"]) and step <= cutoffs.get(attempt, math.inf)
               for (_key, attempt, _rank, step), r in kept(rows).items())
    with Session(engine) as s:
        assert metricstore.nan_count(s, run_id, cutoffs) == want
        assert metricstore.nan_count(s, 999) == 0  # no such run
