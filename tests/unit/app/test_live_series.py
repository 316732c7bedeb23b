"""The Run page's live panels fetch only what is new: incremental merges equal a full fetch.

``merge_series`` (app/data.py) is driven here against two stores: a small in-memory one that
follows db.metricstore's contract to the letter (buckets of 4**L steps, the smallest level with
at most ``max_points`` buckets per (attempt, rank), ``since_step``), and the real store on a real
SQLite file and a real PostgreSQL database. After every refresh the merged rows must be exactly
the rows of a full fetch.

    pytest tests/unit/app/test_live_series.py
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.live_series import LiveSeries, merge_series
from db import metricstore
from db.metricstore import choose_level
from db.requests import create_run
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price

pytestmark = pytest.mark.both_dbs

MAX_POINTS = 50


@dataclass
class FakeStore:
    """Points of one metric of one run, rolled up the way db.metricstore.series promises (its
    own choose_level picks the level)."""

    points: list[tuple[int, int, int, float, float]] = field(default_factory=list)  # attempt, rank, step, value, time
    calls: list[tuple[int | None, int | None]] = field(default_factory=list)

    def log(self, attempt: int, step: int, ranks: int, value: Callable[[int, int], float]) -> None:
        for rank in range(ranks):
            self.points.append((attempt, rank, step, value(rank, step), 1000.0 + step))

    def _buckets(self, level: int) -> dict[tuple[int, int, int], list[tuple[int, float, float]]]:
        size = 4**level
        out: dict[tuple[int, int, int], list[tuple[int, float, float]]] = defaultdict(list)
        for attempt, rank, step, value, t in self.points:
            out[attempt, rank, step // size * size].append((step, value, t))
        return out

    def _level(self, max_points: int) -> int:
        catalogue: dict[tuple[int, int], list[int]] = {}
        for attempt, rank, step, _, _ in self.points:
            c = catalogue.setdefault((attempt, rank), [step, step, 0])
            c[0], c[1], c[2] = min(c[0], step), max(c[1], step), c[2] + 1
        return choose_level([(a, r, c[0], c[1], c[2]) for (a, r), c in catalogue.items()], max_points)

    def series(self, level: int | None, since_step: int | None, max_points: int = MAX_POINTS) -> metricstore.Series:
        self.calls.append((level, since_step))
        level = self._level(max_points) if level is None else level
        rows: list[dict[str, Any]] = []
        for (attempt, rank, first), pts in sorted(self._buckets(level).items()):
            pts.sort()
            if since_step is not None and pts[-1][0] < since_step:
                continue
            finite = [v for _, v, _ in pts if not math.isnan(v)]
            rows.append({
                "attempt": attempt, "rank": rank, "step": first, "last_step": pts[-1][0],
                "value": sum(finite) / len(finite) if finite else math.nan,
                "min": min(finite, default=math.nan), "max": max(finite, default=math.nan),
                "last": pts[-1][1], "count": len(pts), "nan_count": len(pts) - len(finite), "wall_time": pts[-1][2],
            })
        return metricstore.Series(level, 4**level, rows, max((p[2] for p in self.points), default=None))


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows).reset_index(drop=True)


def same_rows(merged: LiveSeries, full: Any) -> None:
    assert merged.level == full.level
    assert len(merged.rows) == len(full.rows)
    if full.rows:
        pd.testing.assert_frame_equal(frame(merged.rows), frame(full.rows))  # NaN == NaN here


def test_incremental_merges_equal_a_full_fetch_through_level_changes_and_a_resume() -> None:
    store = FakeStore()
    rng = random.Random(0)
    value = lambda rank, step: math.nan if step % 97 == 0 else rng.random() + rank  # noqa: E731
    fetch = lambda level, since: store.series(level, since)  # noqa: E731
    cached: LiveSeries | None = None
    levels, incremental = set(), 0

    def refresh(attempts: int, resume_step: int = 0, finished: bool = False) -> LiveSeries:
        nonlocal cached, incremental
        before = len(store.calls)
        cached = merge_series(cached, fetch, max_points=MAX_POINTS, attempts=attempts,
                              newest_attempt=attempts, resume_step=resume_step, finished=finished)
        incremental += sum(1 for level, _ in store.calls[before:] if level is not None)
        levels.add(cached.level)
        same_rows(cached, store.series(None, None))
        return cached

    refresh(attempts=1)  # nothing logged yet
    step = 0
    for _ in range(120):  # attempt 1: 2 ranks, 1..7 steps between refreshes
        for _ in range(rng.randint(1, 7)):
            step += 1
            store.log(1, step, ranks=2, value=value)
        refresh(attempts=1)
    # Attempt 2 resumes from step 300: its first refreshes see no rows of it yet.
    refresh(attempts=2, resume_step=300)
    refresh(attempts=2, resume_step=300)
    for step in range(301, 900):
        store.log(2, step, ranks=2, value=value)
        if step % 5 == 0:
            refresh(attempts=2, resume_step=300)
    assert levels == {0, 1, 2}  # the run outgrew two levels on the way
    assert incremental > 100  # most refreshes were incremental
    final = refresh(attempts=2, resume_step=300, finished=True)
    calls = len(store.calls)
    assert merge_series(final, fetch, max_points=MAX_POINTS, attempts=2, finished=True) is final
    assert len(store.calls) == calls  # a finished run is not asked again


def test_an_incremental_refresh_fetches_only_the_last_buckets() -> None:
    store = FakeStore()
    for step in range(1, 41):
        store.log(1, step, ranks=4, value=lambda rank, step: float(step))
    fetch = lambda level, since: store.series(level, since)  # noqa: E731
    cached = merge_series(None, fetch, max_points=MAX_POINTS, attempts=1, newest_attempt=1)
    assert cached.level == 0 and len(cached.rows) == 160
    store.log(1, 41, ranks=4, value=lambda rank, step: float(step))
    cached = merge_series(cached, fetch, max_points=MAX_POINTS, attempts=1, newest_attempt=1)
    assert store.calls[-1] == (0, 40)  # from the first step of the last cached bucket
    assert cached.fetched == 8  # the last cached bucket and the new one, on each of 4 ranks
    same_rows(cached, store.series(None, None))


# -- the real store -------------------------------------------------------------------------


def test_incremental_merges_equal_a_full_fetch_on_the_real_store(sessions: sessionmaker[Session],
                                                                  tmp_path: Path) -> None:
    with sessions() as s:
        config = RunConfig.model_validate({"name": "live", "train": {"max_steps": 5000}})
        run_id = create_run(s, config, tmp_path / "runs", Price(usd_per_hour=1.0, unit="test")).id
        s.commit()
    rng = random.Random(1)
    fetches: list[int | None] = []  # the level asked for: None for a full fetch

    def fetch(level: int | None, since: int | None) -> metricstore.Series:
        with sessions() as s:
            return metricstore.series(s, run_id, "loss", max_points=MAX_POINTS, level=level, since_step=since)

    def counted_fetch(level: int | None, since: int | None) -> metricstore.Series:
        fetches.append(level)
        return fetch(level, since)

    def write(attempt: int, steps: range) -> None:
        rows = [{"run_id": run_id, "attempt": attempt, "rank": rank, "step": step, "key": "loss",
                 "value": math.nan if step % 101 == 0 else rng.random(), "wall_time": 1000.0 + step}
                for step in steps for rank in range(3)]
        with sessions() as s:
            metricstore.write_points(s.connection(), rows)
            s.commit()

    cached: LiveSeries | None = None
    levels = set()
    for attempts, resume, end in ((1, 0, 700), (2, 400, 2600)):
        step = resume
        while step < end:
            n = rng.randint(1, 40)
            write(attempts, range(step + 1, step + n + 1))
            step += n
            cached = merge_series(cached, counted_fetch, max_points=MAX_POINTS, attempts=attempts,
                                  newest_attempt=attempts, resume_step=resume)
            levels.add(cached.level)
            same_rows(cached, fetch(None, None))
    assert levels == {0, 1, 2, 3}
    assert fetches.count(None) < 10 < len(fetches) - fetches.count(None)  # mostly incremental
    assert cached is not None and sorted({r["attempt"] for r in cached.rows}) == [1, 2]
