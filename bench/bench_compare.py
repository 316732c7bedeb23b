"""What the Compare page's summary costs the database: milliseconds per
``db.compare.metric_summaries`` call (final and best of each metric, the rank mean per step along
the lineage) and per ``db.compare.compare_runs`` call, for runs of growing length.

    .venv/bin/python bench/bench_compare.py [--ranks 8] [--steps 1000,10000,100000] [--runs 3] [--repeats 5]

For each length, ``--runs`` finished runs of ``--ranks`` ranks logging ``loss`` every step are
seeded (bench/seed.py, through ``write_points``) into a temporary SQLite file (removed at the
end). The summary reads every raw point of the chosen metrics of the chosen runs once (one
index range per series, grouped by step as it is read), so its time grows with the points;
the statement count does not grow with the runs. Prints one line per length, one JSON line, and
last its BENCHMARKS.md row (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.benchmarks_row import load_average, print_row  # noqa: E402 - needs ROOT on sys.path
from bench.seed import seed_run  # noqa: E402 - needs ROOT on sys.path
from db.compare import compare_runs, metric_summaries  # noqa: E402 - needs ROOT on sys.path
from db.engine import make_engine, make_sessionmaker, upgrade  # noqa: E402 - needs ROOT on sys.path


def measure(ranks: int, steps: int, runs: int, repeats: int) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="runyard-bench-compare-"))
    try:
        url = f"sqlite:///{folder / 'runyard.db'}"
        upgrade(url)
        ids = [seed_run(url, ranks=ranks, steps=steps, keys=("loss",), name=f"r{i}", runs_dir=folder / "runs")
               for i in range(runs)]
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        summary_ms, runs_ms = [], []
        for _ in range(repeats):
            with sessions() as s:
                t0 = time.perf_counter()
                got = metric_summaries(s, ids, ["loss", "eval_accuracy"])
                summary_ms.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                compare_runs(s, ids)
                runs_ms.append((time.perf_counter() - t0) * 1000)
        assert len(got) == runs
        engine.dispose()
        return {"ranks": ranks, "steps": steps, "runs": runs, "points": ranks * steps * runs,
                "summary_ms": statistics.median(summary_ms), "compare_runs_ms": statistics.median(runs_ms)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", default="1000,10000,100000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    load_at_start = load_average()
    results = []
    for steps in (int(s) for s in args.steps.split(",")):
        r = measure(args.ranks, steps, args.runs, args.repeats)
        results.append(r)
        print(f"{r['runs']} runs x {r['ranks']} ranks x {steps:>7,} steps ({r['points']:>9,} points): "
              f"summary {r['summary_ms']:8.1f} ms, compare_runs {r['compare_runs_ms']:6.1f} ms")
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(json.dumps(results))
    summaries = " / ".join(f"{r['summary_ms']:,.0f}" for r in results)
    lengths = " / ".join(f"{r['steps']:,}" for r in results)
    compares = [r["compare_runs_ms"] for r in results]
    print_row("Compare summary", f"one `metric_summaries` and one `compare_runs` over {args.runs} finished "
              f"{args.ranks}-rank runs, by their length",
              f"summary **{summaries} ms** at {lengths} steps a run ({results[-1]['points']:,} points at the last); "
              f"`compare_runs` {min(compares):.0f}-{max(compares):.0f} ms; medians of {args.repeats}", load_at_start)


if __name__ == "__main__":
    main()
