"""How long one chart's data takes to read: ``metricstore.series(..., max_points=2000)`` for runs
of 100k, 1M and 10M points (8 ranks x one metric).

    .venv/bin/python bench/bench_chart_query.py [--sizes 100000,1000000,10000000] [--repeats 21]
        [--db-url postgresql+psycopg://runyard@127.0.0.1:55432/postgres]

With ``--db-url`` (a PostgreSQL server; the user needs CREATEDB) every size is also seeded into
a database of its own on that server (``runyard_bench_chart_8x<steps>``, kept for later runs;
drop it to reseed), and SQLite and PostgreSQL take turns, so that load falls on both alike.

Each size is one finished run seeded by bench/seed.py's ``seed_run`` (rank 0's write path,
rollups included) into its own SQLite file cached under /tmp/runyard-bench-chart (seeding 10M
points takes a few minutes the first time; progress is printed). Each repetition opens a new
session and reads the loss series of all 8 ranks, the sizes taking turns; the first read of each
size (cold SQLite page cache) is printed apart, the median is over the following ones. Also times the live re-fetch
(``since_step`` = the newest bucket's first step). Prints the medians, the level and rows read,
and ends with its BENCHMARKS.md rows (bench/benchmarks_row.py): SQLite's, and with ``--db-url``
PostgreSQL against SQLite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.benchmarks_row import load_average, print_row, verdict  # noqa: E402 - needs ROOT on sys.path
from bench.seed import seed_run  # noqa: E402 - needs ROOT on sys.path
from db.engine import make_engine, safe_url, upgrade  # noqa: E402 - needs ROOT on sys.path
from db.metricstore import series  # noqa: E402 - needs ROOT on sys.path

CACHE = Path("/tmp/runyard-bench-chart")
RANKS = 8
TARGET_SIZES = (100_000, 10_000_000)  # the target: the largest run's read within 1.5x the smallest's


def seeded(points: int, server: str | None = None) -> tuple[str, int]:
    """A database with one run of ``points`` loss points on 8 ranks, cached by size: a SQLite
    file, or a database on the PostgreSQL ``server``."""
    home = CACHE / f"{RANKS}x{points // RANKS}"
    marker = home / ("run_id" if server is None else "run_id.postgres")
    db_url = f"sqlite:///{home / 'runyard.db'}" if server is None else _server_database(server, home.name)
    if marker.is_file() and (server is None or _has_run(db_url, int(marker.read_text()))):
        return db_url, int(marker.read_text())
    home.mkdir(parents=True, exist_ok=True)
    if server is None:
        for leftover in home.glob("runyard.db*"):
            leftover.unlink()
    upgrade(db_url)
    print(f"seeding {points:,} points into {_shown(db_url)} (cached for later runs)...", flush=True)
    t0 = time.monotonic()
    run_id = seed_run(db_url, ranks=RANKS, steps=points // RANKS, keys=("loss",), runs_dir=home / "runs",
                      progress=True)
    print(f"seeded in {time.monotonic() - t0:.0f} s", flush=True)
    marker.write_text(str(run_id))
    return db_url, run_id


def _shown(db_url: str) -> str:
    return safe_url(db_url)


def _server_database(server: str, name: str) -> str:
    """The URL of database ``runyard_bench_chart_<name>`` on ``server``, recreated empty unless
    it holds a seeded run."""
    database = f"runyard_bench_chart_{name}"
    admin = create_engine(server, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            if not conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": database}).first():
                conn.execute(text(f'CREATE DATABASE "{database}"'))
    finally:
        admin.dispose()
    return make_url(server).set(database=database).render_as_string(hide_password=False)


def _has_run(db_url: str, run_id: int) -> bool:
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return bool(conn.execute(text("SELECT count(*) FROM metric_points WHERE run_id = :r"), {"r": run_id})
                        .scalar())
    except SQLAlchemyError:
        return False
    finally:
        engine.dispose()


def time_once(engine, run_id: int) -> tuple[float, float, object, object]:  # type: ignore[no-untyped-def]
    """One chart read and one live re-fetch of its newest bucket, each in a new session."""
    with Session(engine) as s:
        t0 = time.perf_counter()
        got = series(s, run_id, "loss", max_points=2000)
        full = time.perf_counter() - t0
    with Session(engine) as s:
        t0 = time.perf_counter()
        newest = series(s, run_id, "loss", level=got.level, since_step=got.rows[-1]["step"])
        live = time.perf_counter() - t0
    return full, live, got, newest


def points_label(points: int) -> str:
    """100000 -> "100k", 10000000 -> "10M"."""
    for size, suffix in ((1_000_000, "M"), (1_000, "k")):
        if points >= size and points % size == 0:
            return f"{points // size}{suffix}"
    return f"{points:,}"


def print_rows(results: dict[str, dict], sizes: list[int], postgres: bool, load_at_start: float) -> None:
    """The BENCHMARKS.md rows: SQLite's reads by run size, and PostgreSQL's against SQLite's."""
    big, small = results[f"sqlite {max(sizes)}"], results[f"sqlite {min(sizes)}"]
    parts = []
    for p in sorted(sizes):
        ms = results[f"sqlite {p}"]["median_ms"]
        target = f"**{ms:.1f} ms** (target <= 100 ms: {verdict(ms <= 100)})" if p >= 10_000_000 else f"{ms:.1f} ms"
        parts.append(f"{points_label(p)} points {target}")
    if len(sizes) > 1:
        grows = big["median_ms"] / small["median_ms"]
        target = f" (target <= 1.5x: {verdict(grows <= 1.5)})" if (min(sizes), max(sizes)) == TARGET_SIZES else ""
        parts.append(f"{points_label(max(sizes))} / {points_label(min(sizes))} **{grows:.2f}x**{target}")
    parts.append(f"live re-fetch {big['live_median_ms']:.1f} ms")
    print_row("Chart query", "one chart's read (`series`: 8 ranks, at most 2,000 points each) by the run's size, "
              "and the live panel's re-fetch",
              "SQLite: " + "; ".join(parts) + "; medians", load_at_start)
    if not postgres:
        return
    per_size = []
    for p in sorted(sizes):
        pg, lite = results[f"postgres {p}"], results[f"sqlite {p}"]
        chart = pg["median_ms"] / lite["median_ms"]
        per_size.append(f"{points_label(p)} points: chart **{chart:.2f}x** ({verdict(chart <= 2.0)}), live re-fetch "
                        f"{pg['live_median_ms'] / lite['live_median_ms']:.2f}x")
    print_row("Chart query, PostgreSQL / SQLite", "the same reads on PostgreSQL against SQLite, taking turns",
              "; ".join(per_size) + "; target <= 2x; ratios of the medians", load_at_start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--db-url", help="a PostgreSQL server to measure beside SQLite (see the docstring)")
    args = parser.parse_args()
    load_at_start = load_average()
    sizes = [int(s) for s in args.sizes.split(",")]
    backends: dict[str, str | None] = {"sqlite": None, **({"postgres": args.db_url} if args.db_url else {})}
    cases = [(db, points) for points in sizes for db in backends]
    engines = {}
    for db, points in cases:
        db_url, run_id = seeded(points, backends[db])
        engines[(db, points)] = (make_engine(db_url), run_id)
    times: dict[tuple, list[float]] = {c: [] for c in cases}
    lives: dict[tuple, list[float]] = {c: [] for c in cases}
    shapes: dict[tuple, tuple] = {}
    first: dict[tuple, float] = {}
    for rep in range(args.repeats + 1):  # the cases take turns, so that load falls on all alike
        for case in cases:
            engine, run_id = engines[case]
            full, live, got, newest = time_once(engine, run_id)
            if rep == 0:
                first[case] = full * 1000
                shapes[case] = (got.level, got.bucket_steps, len(got.rows), len(newest.rows))
            else:
                times[case].append(full * 1000)
                lives[case].append(live * 1000)
    results: dict[str, dict] = {}
    for db, points in cases:
        level, bucket, rows, live_rows = shapes[(db, points)]
        r = results[f"{db} {points}"] = {
            "median_ms": statistics.median(times[(db, points)]), "first_ms": first[(db, points)],
            "live_median_ms": statistics.median(lives[(db, points)]), "level": level, "bucket_steps": bucket,
            "rows": rows, "live_rows": live_rows}
        print(f"{db:>8} {points:>11,} points: median {r['median_ms']:6.1f} ms (first {r['first_ms']:6.1f} ms), "
              f"level {level} ({bucket} steps a bucket), {rows} rows; "
              f"live re-fetch {r['live_median_ms']:.1f} ms, {live_rows} rows", flush=True)
    for engine, _ in engines.values():
        engine.dispose()
    for db in backends:
        if len(sizes) > 1:
            big, small = results[f"{db} {max(sizes)}"], results[f"{db} {min(sizes)}"]
            print(f"{db} largest / smallest: {big['median_ms'] / small['median_ms']:.2f}x")
    if args.db_url:
        for points in sizes:
            pg, lite = results[f"postgres {points}"], results[f"sqlite {points}"]
            print(f"{points:,} points, postgres / sqlite: chart {pg['median_ms'] / lite['median_ms']:.2f}x, "
                  f"live re-fetch {pg['live_median_ms'] / lite['live_median_ms']:.2f}x")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps({"repeats": args.repeats, "results": results}))
    print_rows(results, sizes, bool(args.db_url), load_at_start)

if __name__ == "__main__":
    main()
