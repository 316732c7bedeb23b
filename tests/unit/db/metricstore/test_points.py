"""The metric store's reads other than a chart's series (db/metricstore/points.py): the newest
points of many series at once equal each series' own, across the UNION statements they take.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from bench.bench_runs_list import seed_runs
from db import metricstore
from db.models import Attempt
from db.vocabulary.settings import Settings

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
