"""How long one chart's data takes to read: ``metricstore.series(..., max_points=2000)`` for runs
of 100k, 1M and 10M points (8 ranks x one metric).

    .venv/bin/python bench/bench_chart_query.py [--sizes 100000,1000000,10000000] [--repeats 21]

Each size is one finished run seeded by bench/seed.py's ``seed_run`` (rank 0's write path,
rollups included) into its own SQLite file cached under /tmp/runyard-bench-chart (seeding 10M
points takes a few minutes the first time; progress is printed). Each repetition opens a new
session and reads the loss series of all 8 ranks, the sizes taking turns; the first read of each
size (cold SQLite page cache) is printed apart, the median is over the following ones. Also times the live re-fetch
(``since_step`` = the newest bucket's first step). Prints the medians, the level and rows read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CACHE = Path("/tmp/runyard-bench-chart")
RANKS = 8


def seeded(points: int) -> tuple[str, int]:
    """A database with one run of ``points`` loss points on 8 ranks, cached by size."""
    from bench.seed import seed_run
    from db.engine import upgrade

    home = CACHE / f"{RANKS}x{points // RANKS}"
    marker = home / "run_id"
    db_url = f"sqlite:///{home / 'runyard.db'}"
    if marker.is_file():
        return db_url, int(marker.read_text())
    home.mkdir(parents=True, exist_ok=True)
    for leftover in home.glob("runyard.db*"):
        leftover.unlink()
    upgrade(db_url)
    print(f"seeding {points:,} points into {home} (cached for later runs)...", flush=True)
    t0 = time.monotonic()
    run_id = seed_run(db_url, ranks=RANKS, steps=points // RANKS, keys=("loss",), progress=True)
    print(f"seeded in {time.monotonic() - t0:.0f} s", flush=True)
    marker.write_text(str(run_id))
    return db_url, run_id


def time_once(engine, run_id: int) -> tuple[float, float, object, object]:  # type: ignore[no-untyped-def]
    """One chart read and one live re-fetch of its newest bucket, each in a new session."""
    from sqlalchemy.orm import Session

    from db.metricstore import series

    with Session(engine) as s:
        t0 = time.perf_counter()
        got = series(s, run_id, "loss", max_points=2000)
        full = time.perf_counter() - t0
    with Session(engine) as s:
        t0 = time.perf_counter()
        newest = series(s, run_id, "loss", level=got.level, since_step=got.rows[-1]["step"])
        live = time.perf_counter() - t0
    return full, live, got, newest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    from db.engine import make_engine

    sizes = [int(s) for s in args.sizes.split(",")]
    engines = {}
    for points in sizes:
        db_url, run_id = seeded(points)
        engines[points] = (make_engine(db_url), run_id)
    times: dict[int, list[float]] = {p: [] for p in sizes}
    lives: dict[int, list[float]] = {p: [] for p in sizes}
    shapes: dict[int, tuple] = {}
    first: dict[int, float] = {}
    for rep in range(args.repeats + 1):  # the sizes take turns, so that load falls on all alike
        for points in sizes:
            engine, run_id = engines[points]
            full, live, got, newest = time_once(engine, run_id)
            if rep == 0:
                first[points] = full * 1000
                shapes[points] = (got.level, got.bucket_steps, len(got.rows), len(newest.rows))
            else:
                times[points].append(full * 1000)
                lives[points].append(live * 1000)
    results = {}
    for points in sizes:
        level, bucket, rows, live_rows = shapes[points]
        r = results[points] = {"median_ms": statistics.median(times[points]), "first_ms": first[points],
                               "live_median_ms": statistics.median(lives[points]), "level": level,
                               "bucket_steps": bucket, "rows": rows, "live_rows": live_rows}
        print(f"{points:>11,} points: median {r['median_ms']:6.1f} ms (first {r['first_ms']:6.1f} ms), "
              f"level {level} ({bucket} steps a bucket), {rows} rows; "
              f"live re-fetch {r['live_median_ms']:.1f} ms, {live_rows} rows", flush=True)
    for engine, _ in engines.values():
        engine.dispose()
    sizes = sorted(results)
    if len(sizes) > 1:
        print(f"largest / smallest: {results[sizes[-1]]['median_ms'] / results[sizes[0]]['median_ms']:.2f}x")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps({"repeats": args.repeats, "results": results}))


if __name__ == "__main__":
    main()
