"""A live panel's copy of one metric of one run, refreshed incrementally: the first fetch takes
the whole range at the level the metric store picks, every later one only the buckets from the
last cached one on (:func:`merge_series`). No Streamlit and no database here: the fetch is handed
in (app/data.py's ``metric_series``, bound to a run and a metric)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from db.metricstore import Series, choose_level

Fetch = Callable[[int | None, int | None], Series]
"""(level, since_step) -> Series: a bound metric_series."""


@dataclass
class LiveSeries:
    """What a live panel holds of one metric of one run: the rollup level it was fetched at,
    the rows fetched so far (sorted by attempt, rank, step), and what the run looked like then."""

    level: int
    bucket_steps: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    max_step: int | None = None
    attempts: int = 0  # the run's attempt count at the last fetch
    final: bool = False  # fetched after the run ended: nothing more will come
    fetched: int = 0  # buckets the last fetch brought (what the live panel costs, for tests and logs)


def _row_key(row: dict[str, Any]) -> tuple[int, int, int]:
    return row["attempt"], row["rank"], row["step"]


def _since_step(rows: list[dict[str, Any]], attempt: int) -> int:
    """The first step of ``attempt``'s last cached bucket, the earliest over its ranks: every
    bucket before it is complete, because an (attempt, rank) series only grows at its end (and
    older attempts no longer grow at all)."""
    last: dict[int, int] = {}
    for r in rows:
        if r["attempt"] == attempt:
            last[r["rank"]] = max(last.get(r["rank"], r["step"]), r["step"])
    return min(last.values())


def _level_for(rows: list[dict[str, Any]], max_points: int) -> int:
    """The level the store would pick for the whole range these rows cover (the same
    catalogue of (attempt, rank, first step, last step, points) that the store reads)."""
    catalogue: dict[tuple[int, int], list[int]] = {}
    for r in rows:
        c = catalogue.get((r["attempt"], r["rank"]))
        if c is None:
            catalogue[r["attempt"], r["rank"]] = [r["step"], r["last_step"], r["count"]]
        else:
            c[0], c[1], c[2] = min(c[0], r["step"]), max(c[1], r["last_step"]), c[2] + r["count"]
    return choose_level([(a, k, c[0], c[1], c[2]) for (a, k), c in catalogue.items()], max_points)


def merge_series(cached: LiveSeries | None, fetch: Fetch, *, max_points: int, attempts: int,
                 newest_attempt: int = 0, resume_step: int = 0, finished: bool = False) -> LiveSeries:
    """The series after one refresh of a live panel, fetching only what is new.

    The first call (or after a new attempt began, which starts from an earlier step) fetches the
    whole range and lets the store pick the level. Later calls ask the store, at the cached
    level, for the buckets from the first step of the last cached bucket on: those replace the
    cached buckets with the same (attempt, rank, step) (the last one had grown) and the rest are
    appended. When the store would then pick another level for the whole range (a series
    outgrew ``max_points`` buckets at this one), it is fetched in full again.

    Args:
        cached: what the panel held, or None.
        fetch: ``(level, since_step) -> Series`` for this run and metric.
        max_points: the most buckets per (attempt, rank) series.
        attempts: the run's attempt count now.
        newest_attempt: the newest attempt's number, with ``resume_step`` the step it started
            from: where to ask from while it has no rows yet.
        finished: the run has ended; once fetched after that, the series is not asked again.
    """
    if cached is not None and cached.final and cached.attempts == attempts:
        return cached
    if cached is None or cached.attempts != attempts or not cached.rows:
        return _full(fetch, attempts, finished)
    newest_cached = max(r["attempt"] for r in cached.rows)
    # The newest attempt has logged nothing yet: its first rows will come from its resume step.
    since = resume_step if newest_attempt > newest_cached else _since_step(cached.rows, newest_cached)
    new = fetch(cached.level, since)
    fresh = {_row_key(r) for r in new.rows}
    rows = [r for r in cached.rows if _row_key(r) not in fresh] + list(new.rows)
    rows.sort(key=_row_key)
    if _level_for(rows, max_points) != cached.level:
        return _full(fetch, attempts, finished)
    return LiveSeries(level=cached.level, bucket_steps=cached.bucket_steps, rows=rows,
                      max_step=max((m for m in (cached.max_step, new.max_step) if m is not None), default=None),
                      attempts=attempts, final=finished, fetched=len(new.rows))


def _full(fetch: Fetch, attempts: int, finished: bool) -> LiveSeries:
    full = fetch(None, None)
    return LiveSeries(level=full.level, bucket_steps=full.bucket_steps, rows=list(full.rows),
                      max_step=full.max_step, attempts=attempts, final=finished, fetched=len(full.rows))
