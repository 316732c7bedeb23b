"""The metric store: every rank's metric points, and rollups that keep a chart of a long run cheap.

Rank 0's writer calls :func:`write_points` with each batch; the charts call :func:`series`,
which reads either the raw points or one rollup level, always as one index range scan, so a
chart of a 10M-point run reads about as many rows as one of a 100k-point run.

Both big tables are clustered on their primary key on SQLite (WITHOUT ROWID), with the rank
last: a chart reads one contiguous range, and a batch of a live run appends to one place per
metric and level instead of one per (metric, rank, level), which is what write throughput
comes down to.

Tables (db/models.py):

- ``metric_names``: each metric name once; the other tables hold its id.
- ``metric_points``: the raw points, keyed by (run, name, attempt, step, rank). A point is
  written once: when the same (run, key, attempt, step, rank) arrives again, in the same batch
  or a later one, the first value is kept and the later one dropped, so that the rollups always
  equal what the stored points give.
- ``metric_rollups``: for each level 1..``LEVELS``, the points of one (run, name, attempt, rank)
  in buckets of ``4**level`` steps (``bucket = step // 4**level``): min, max, sum, count,
  nan_count, first and last step, the wall time at each, and the value at the last step. Every
  batch updates every level (level 1 from the batch's points, each higher level from the level
  below, then one upsert that merges them into the stored buckets: db/metricstore/rollups.py), so
  points that arrive out of order or over several batches give exactly the rollups one batch
  would (the sum up to floating-point rounding).

NaN and infinities (the rule every reader here follows):

- SQLite cannot store a NaN (it turns one into NULL), so a NULL value *is* NaN, on every
  database: a raw ``value``, a rollup's ``last_value``. Readers return ``float("nan")`` for it,
  never None. +Inf and -Inf are stored as real infinities.
- A rollup's min, max and sum (hence mean) are over the non-NaN values: min and max are NULL
  (read as NaN) when every value in the bucket is NaN, and the mean is then NaN. ``count``
  counts every point, ``nan_count`` the NaN ones. A sum that meets both +Inf and -Inf is NaN
  (stored as NULL), so that bucket's mean is NaN, as Python's arithmetic would say.
- ``last`` is the value at the bucket's largest step and may be NaN.

Steps are expected to be >= 0 (buckets use floor division).
"""

from __future__ import annotations

from db.metricstore.points import (
    at_or_before,
    iter_rows,
    latest,
    metric_keys,
    nan_count,
    progress_key,
    progress_keys,
    recent,
    recent_many,
    recent_progress,
    totals,
)
from db.metricstore.rollups import BASE, LEVELS, MetricStoreError
from db.metricstore.series import Series, choose_level, series
from db.metricstore.writes import write_points

# The store's interface, whatever module of it a name is defined in: writes.py (the write path),
# series.py (a chart's series), points.py (every other read), rollups.py (the rollup arithmetic),
# bulk.py (PostgreSQL's COPY, loaded by writes.py on PostgreSQL only).
__all__ = ["BASE", "LEVELS", "MetricStoreError", "Series", "at_or_before", "choose_level", "iter_rows", "latest",
           "metric_keys", "nan_count",
           "progress_key", "progress_keys", "recent", "recent_many", "recent_progress", "series", "totals",
           "write_points"]
