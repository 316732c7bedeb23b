"""Metric ingest: points per second through runyard's write path against MLflow's own
SQLAlchemy tracking store, side by side, both on SQLite files in the same temp folder.

    .venv/bin/python bench/bench_ingest.py [--reps 3] [--steps 2500] [--mlflow-python /tmp/mlflow-bench/bin/python]

The points: 8 ranks x 10 metrics at every step (80 points a step). runyard gets them as rank 0's
DatabaseWriter hands them over, one ``write_points`` transaction per flush (every second): ``--batch-steps``
steps a batch (625 steps = 50k points: what one flush holds at 100k points/s), and again in
12-step batches (960 points). MLflow gets the same points through
``SqlAlchemyStore.log_batch`` in batches of 12 steps (960 metrics; MLflow refuses more than
1000 a call), each rank's value as its own key ``<metric>/rank<r>`` (MLflow has no rank).
Only the writes are timed (not building the rows, not creating the schema or the run). Each
repetition uses a fresh folder; the three are interleaved so that load affects them alike.

MLflow is not a dependency of runyard: install it into a throwaway virtual environment and
name its interpreter with ``--mlflow-python`` (the MLflow side then runs there, in a child
process), or run this script with an interpreter that has both. Without MLflow the runyard side
runs alone and a message says so:

    python3 -m venv /tmp/mlflow-bench && /tmp/mlflow-bench/bin/pip install mlflow-skinny sqlalchemy alembic
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANKS, KEYS = 8, [f"metric_{i}" for i in range(10)]
MLFLOW_BATCH_STEPS = 12  # 12 x 80 = 960 metrics a call; MLflow's limit is 1000


def points(steps: int, batch_steps: int) -> Iterator[list[tuple[str, int, int, float, float]]]:
    """Batches of (key, rank, step, value, wall time), step by step, the same for both stores."""
    start = 1.7e9
    for first in range(0, steps, batch_steps):
        yield [
            (key, rank, step, 2.0 / math.sqrt(1 + step / 50) + 0.01 * rank + 0.1 * k, start + step * 0.01)
            for step in range(first, min(steps, first + batch_steps))
            for k, key in enumerate(KEYS)
            for rank in range(RANKS)
        ]


def runyard_ingest(folder: Path, steps: int, batch_steps: int) -> dict[str, float]:
    """Points/s through ``write_points``, one transaction per batch (as DatabaseWriter does)."""
    sys.path.insert(0, str(ROOT))
    from bench.seed import create_finished_run
    from db.engine import make_engine, upgrade
    from db.metricstore import write_points

    db_url = f"sqlite:///{folder / f'runyard-{batch_steps}.db'}"
    upgrade(db_url)
    run_id = create_finished_run(db_url, "ingest", RANKS, steps)
    engine = make_engine(db_url, foreign_keys=False)  # as rank 0's DatabaseWriter makes it
    spent, count = 0.0, 0
    try:
        for batch in points(steps, batch_steps):
            rows = [{"run_id": run_id, "attempt": 1, "rank": rank, "step": step, "key": key, "value": value,
                     "wall_time": wall} for key, rank, step, value, wall in batch]
            t0 = time.perf_counter()
            with engine.begin() as conn:
                write_points(conn, rows)
            spent += time.perf_counter() - t0
            count += len(rows)
    finally:
        engine.dispose()
    return {"points": count, "seconds": spent, "points_per_s": count / spent}


def mlflow_ingest(folder: Path, steps: int) -> dict[str, float]:
    """Points/s through MLflow's SqlAlchemyStore.log_batch (run in an interpreter with MLflow)."""
    import logging

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from mlflow.entities import Metric
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(f"sqlite:///{folder / 'mlflow.db'}", str(folder / "mlflow-artifacts"))
    experiment = store.create_experiment("ingest")
    run_id = store.create_run(experiment, "bench", int(time.time() * 1000), [], "ingest").info.run_id
    spent, count = 0.0, 0
    for batch in points(steps, MLFLOW_BATCH_STEPS):
        metrics = [Metric(f"{key}/rank{rank}", value, int(wall * 1000), step) for key, rank, step, value, wall in batch]
        t0 = time.perf_counter()
        store.log_batch(run_id, metrics=metrics, params=[], tags=[])
        spent += time.perf_counter() - t0
        count += len(metrics)
    return {"points": count, "seconds": spent, "points_per_s": count / spent}


def mlflow_side(folder: Path, steps: int, python: str | None) -> dict[str, float] | None:
    """The MLflow measurement: here when MLflow imports, else in ``python``, else None."""
    if python is None:
        try:
            import mlflow  # noqa: F401
        except ImportError:
            return None
        return mlflow_ingest(folder, steps)
    out = subprocess.run([python, __file__, "--mlflow-worker", str(folder), "--steps", str(steps)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2500, help="steps per repetition (80 points a step)")
    parser.add_argument("--batch-steps", type=int, default=625)
    parser.add_argument("--mlflow-python", help="an interpreter that has MLflow (see the docstring)")
    parser.add_argument("--mlflow-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mlflow_worker:
        print(json.dumps(mlflow_ingest(Path(args.mlflow_worker), args.steps)))
        return

    sides = {f"runyard, {args.batch_steps}-step batches": args.batch_steps, "runyard, 12-step batches": 12}
    results: dict[str, list[float]] = {name: [] for name in [*sides, "mlflow"]}
    mlflow_missing = False
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="runyard-ingest-") as tmp:
            folder = Path(tmp)
            line = []
            for name, batch_steps in sides.items():
                r = runyard_ingest(folder, args.steps, batch_steps)
                results[name].append(r["points_per_s"])
                line.append(f"{name} {r['points_per_s']:,.0f}/s")
            m = None if mlflow_missing else mlflow_side(folder, args.steps, args.mlflow_python)
            if m is None:
                if not mlflow_missing:
                    print("MLflow is not installed here: skipping the MLflow side (see BENCHMARKS.md for how to "
                          "run it with --mlflow-python).", flush=True)
                mlflow_missing = True
            else:
                results["mlflow"].append(m["points_per_s"])
                line.append(f"mlflow {m['points_per_s']:,.0f}/s")
            print(f"rep {rep + 1} ({args.steps * 80:,} points each): " + ", ".join(line), flush=True)
    medians = {name: statistics.median(v) for name, v in results.items() if v}
    print("median points/s: " + ", ".join(f"{name} {v:,.0f}" for name, v in medians.items()))
    ratios = {}
    if "mlflow" in medians:
        for name in sides:
            per_rep = [a / b for a, b in zip(results[name], results["mlflow"], strict=True)]
            ratios[name] = statistics.median(per_rep)
            print(f"{name} / mlflow: {ratios[name]:.1f}x (median of per-repetition ratios "
                  f"{', '.join(f'{x:.1f}' for x in per_rep)})")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps({"reps": args.reps, "points_per_rep": args.steps * 80, "median_points_per_s": medians,
                      "ratio_to_mlflow": ratios}))


if __name__ == "__main__":
    main()
