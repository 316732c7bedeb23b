"""Metric ingest: points per second through runyard's write path against MLflow's own
SQLAlchemy tracking store, side by side, both on SQLite files in the same temp folder, and with
``--db-url`` on a PostgreSQL server as well.

    .venv/bin/python bench/bench_ingest.py [--reps 3] [--steps 2500] [--mlflow-python /tmp/mlflow-bench/bin/python]
        [--db-url postgresql+psycopg://runyard@127.0.0.1:55432/postgres]

``--db-url`` names a PostgreSQL server (a database on it the user may connect to, with CREATEDB):
each repetition then also writes the same points into a fresh database created on it for that
side (dropped after), and prints PostgreSQL / SQLite per repetition.

The points: 8 ranks x 10 metrics at every step (80 points a step). The headline compares like
with like: runyard and MLflow at the same batch sizes, 1 step (80 points: one commit per step)
and 12 steps (960 points: the largest batch MLflow allows, it refuses more than 1000 metrics a
call). runyard gets them as rank 0's DatabaseWriter hands them over, one ``write_points``
transaction per batch; MLflow through ``SqlAlchemyStore.log_batch``, each rank's value as its
own key ``<metric>/rank<r>`` (MLflow has no rank). Separately, runyard's own large flush:
``--batch-steps`` steps a batch (625 steps = 50k points: what one one-second flush holds at
100k points/s), against MLflow's largest call; a different batch size, so not the headline.
1-step batches write ``--steps`` / 5 steps (points/s is per point either way).
Only the writes are timed (not building the rows, not creating the schema or the run). Each
repetition uses a fresh folder; the sides take turns (SQLite and PostgreSQL of one batch size
back to back) so that load affects them alike.

MLflow is not a dependency of runyard: install it into a throwaway virtual environment and
name its interpreter with ``--mlflow-python`` (the MLflow side then runs there, in a child
process), or run this script with an interpreter that has both. Without MLflow the runyard side
runs alone and a message says so:

    python3 -m venv /tmp/mlflow-bench && /tmp/mlflow-bench/bin/pip install mlflow-skinny sqlalchemy alembic

Ends with its BENCHMARKS.md rows (bench/benchmarks_row.py): against MLflow, and with ``--db-url``
PostgreSQL against SQLite.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks_row import load_average, print_row, verdict

ROOT = Path(__file__).resolve().parents[1]
RANKS, KEYS = 8, [f"metric_{i}" for i in range(10)]
MLFLOW_BATCH_STEPS = 12  # 12 x 80 = 960 metrics a call; MLflow's limit is 1000
EQUAL_BATCHES = (1, MLFLOW_BATCH_STEPS)  # the batch sizes both sides are measured at
DATABASES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


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


def runyard_ingest(folder: Path, steps: int, batch_steps: int, server: str | None = None) -> dict[str, float]:
    """Points/s through ``write_points``, one transaction per batch (as DatabaseWriter does), into
    a SQLite file in ``folder``, or into a fresh database on the PostgreSQL ``server``."""
    sys.path.insert(0, str(ROOT))
    if server is None:
        return _runyard_ingest(f"sqlite:///{folder / f'runyard-{batch_steps}.db'}", folder, steps, batch_steps)
    from tests.databases import fresh_database  # noqa: PLC0415 - runyard's: this script also runs under MLflow's python (--mlflow-worker)

    with fresh_database(server) as db_url:
        return _runyard_ingest(db_url, folder, steps, batch_steps)


def _runyard_ingest(db_url: str, folder: Path, steps: int, batch_steps: int) -> dict[str, float]:
    from bench.seed import create_finished_run  # noqa: PLC0415 - runyard's: this script also runs under MLflow's python (--mlflow-worker)
    from db.engine import make_engine, upgrade  # noqa: PLC0415 - runyard's: this script also runs under MLflow's python (--mlflow-worker)
    from db.metricstore import write_points  # noqa: PLC0415 - runyard's: this script also runs under MLflow's python (--mlflow-worker)

    upgrade(db_url)
    run_id = create_finished_run(db_url, "ingest", RANKS, steps, runs_dir=folder / "runs")
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


def mlflow_ingest(folder: Path, steps: int, store_url: str | None = None,
                  batch_steps: int = MLFLOW_BATCH_STEPS) -> dict[str, float]:
    """Points/s through MLflow's SqlAlchemyStore.log_batch (run in an interpreter with MLflow),
    on a SQLite file in ``folder`` or on ``store_url``."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from mlflow.entities import Metric  # noqa: PLC0415 - optional: MLflow is not runyard's dependency
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: PLC0415 - optional: MLflow is not runyard's dependency

    store = SqlAlchemyStore(store_url or f"sqlite:///{folder / f'mlflow-{batch_steps}.db'}",
                            str(folder / "mlflow-artifacts"))
    experiment = store.create_experiment("ingest")
    run_id = store.create_run(experiment, "bench", int(time.time() * 1000), [], "ingest").info.run_id
    spent, count = 0.0, 0
    for batch in points(steps, batch_steps):
        metrics = [Metric(f"{key}/rank{rank}", value, int(wall * 1000), step) for key, rank, step, value, wall in batch]
        t0 = time.perf_counter()
        store.log_batch(run_id, metrics=metrics, params=[], tags=[])
        spent += time.perf_counter() - t0
        count += len(metrics)
    return {"points": count, "seconds": spent, "points_per_s": count / spent}


def mlflow_side(folder: Path, steps: int, python: str | None, server: str | None = None,
                batch_steps: int = MLFLOW_BATCH_STEPS) -> dict[str, float] | None:
    """The MLflow measurement: here when MLflow imports, else in ``python``, else None; on SQLite,
    or on a fresh database on the PostgreSQL ``server``."""
    if python is None:
        try:
            import mlflow  # noqa: F401, PLC0415 - optional: MLflow is not runyard's dependency
        except ImportError:
            return None
    if server is None:
        return _mlflow_run(folder, steps, python, None, batch_steps)
    sys.path.insert(0, str(ROOT))
    from tests.databases import fresh_database  # noqa: PLC0415 - runyard's: this script also runs under MLflow's python (--mlflow-worker)

    with fresh_database(server) as url:
        return _mlflow_run(folder, steps, python, url, batch_steps)


def _mlflow_run(folder: Path, steps: int, python: str | None, store_url: str | None,
                batch_steps: int) -> dict[str, float]:
    if python is None:
        return mlflow_ingest(folder, steps, store_url, batch_steps)
    extra = ["--mlflow-store", store_url] if store_url else []
    out = subprocess.run([python, __file__, "--mlflow-worker", str(folder), "--steps", str(steps),
                          "--batch-steps", str(batch_steps), *extra],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def paired_ratio(results: dict[str, list[float]], top: str, bottom: str) -> float | None:
    """The median of the per-repetition ratios ``top`` / ``bottom``, or None where a side is missing."""
    if results.get(top) and results.get(bottom) and len(results[top]) == len(results[bottom]):
        return statistics.median(a / b for a, b in zip(results[top], results[bottom], strict=True))
    return None


def print_rows(results: dict[str, list[float]], servers: list[str], batch_steps: int, reps: int,
               load_at_start: float) -> None:
    """The BENCHMARKS.md rows: runyard against MLflow (or alone), and PostgreSQL against SQLite."""
    parts = []
    for db in servers:
        against = [(b, paired_ratio(results, f"runyard {db}, {b}-step batches", f"mlflow {db}, {b}-step batches"))
                   for b in EQUAL_BATCHES]
        said = [f"**{r:.1f}x** at {b * 80} points" for b, r in against if r is not None]
        if said:
            parts.append(f"runyard / MLflow on {DATABASES[db]} " + ", ".join(said))
    if not parts:
        parts.append("runyard alone (no MLflow side: `--mlflow-python`)")
    flush = statistics.median(results[f"runyard sqlite, {batch_steps}-step batches"])
    parts.append(f"runyard's own {batch_steps}-step flush {flush:,.0f} points/s on SQLite (target >= 100k: "
                 f"{verdict(flush >= 100_000)})")
    print_row("Metric ingest", "points/s through rank 0's write path against MLflow's tracking store, the same "
              f"batches (80 and 960 points), on {' and '.join(DATABASES[db] for db in servers)}",
              "; ".join(parts) + f"; medians over {reps} repetitions", load_at_start)
    if "postgres" not in servers:
        return
    slower = []
    for b in (batch_steps, MLFLOW_BATCH_STEPS, 1):
        r = paired_ratio(results, f"runyard sqlite, {b}-step batches", f"runyard postgres, {b}-step batches")
        if r is not None:
            slower.append(f"**{r:.2f}x** at {b}-step batches ({verdict(r <= 2.0)})")
    print_row("Metric ingest, PostgreSQL / SQLite", "runyard's write path on PostgreSQL against SQLite, by batch "
              "size, taking turns", "PostgreSQL slower by " + ", ".join(slower)
              + f", target <= 2x; medians over {reps} repetitions", load_at_start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2500, help="steps per repetition (80 points a step)")
    parser.add_argument("--batch-steps", type=int, default=625)
    parser.add_argument("--mlflow-python", help="an interpreter that has MLflow (see the docstring)")
    parser.add_argument("--db-url", help="a PostgreSQL server to measure as well (see the docstring)")
    parser.add_argument("--no-mlflow", action="store_true", help="measure runyard only")
    parser.add_argument("--mlflow-worker", help=argparse.SUPPRESS)
    parser.add_argument("--mlflow-store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mlflow_worker:
        print(json.dumps(mlflow_ingest(Path(args.mlflow_worker), args.steps, args.mlflow_store, args.batch_steps)))
        return
    load_at_start = load_average()

    servers: dict[str, str | None] = {"sqlite": None}
    if args.db_url:
        servers["postgres"] = args.db_url
    # Each batch size's sides run back to back (runyard, MLflow; SQLite, PostgreSQL), so that the
    # two sides of each ratio meet about the same load.
    sides: dict[str, tuple[str, int, str | None]] = {}
    for b in (*EQUAL_BATCHES, args.batch_steps):
        for db, server in servers.items():
            sides[f"runyard {db}, {b}-step batches"] = ("runyard", b, server)
            if not args.no_mlflow and b in EQUAL_BATCHES:
                sides[f"mlflow {db}, {b}-step batches"] = ("mlflow", b, server)
    results: dict[str, list[float]] = {name: [] for name in sides}
    mlflow_missing = False
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="runyard-ingest-") as tmp:
            folder = Path(tmp)
            line = []
            for name, (who, batch_steps, server) in sides.items():
                steps = args.steps // 5 if batch_steps == 1 else args.steps
                if who == "runyard":
                    r: dict[str, float] | None = runyard_ingest(folder, steps, batch_steps, server)
                else:
                    r = None if mlflow_missing else mlflow_side(folder, steps, args.mlflow_python, server, batch_steps)
                    if r is None and not mlflow_missing:
                        print("MLflow is not installed here: skipping the MLflow side (this script's docstring "
                              "says how to run it with --mlflow-python).", flush=True)
                        mlflow_missing = True
                if r is not None:
                    results[name].append(r["points_per_s"])
                    line.append(f"{name} {r['points_per_s']:,.0f}/s")
            print(f"rep {rep + 1}: " + ", ".join(line), flush=True)
    medians = {name: statistics.median(v) for name, v in results.items() if v}
    print("median points/s: " + ", ".join(f"{name} {v:,.0f}" for name, v in medians.items()))
    ratios: dict[str, float] = {}

    def ratio(label: str, top: str, bottom: str) -> None:
        value = paired_ratio(results, top, bottom)
        if value is not None:
            ratios[label] = value

    for db in servers:
        for b in EQUAL_BATCHES:  # the headline: the same batch size on both sides
            ratio(f"{db}: runyard / MLflow at {b}-step batches ({b * 80} points)",
                  f"runyard {db}, {b}-step batches", f"mlflow {db}, {b}-step batches")
        ratio(f"{db}: runyard's own {args.batch_steps}-step flush / MLflow's largest call (12 steps; not like "
              "for like)",
              f"runyard {db}, {args.batch_steps}-step batches", f"mlflow {db}, 12-step batches")
    if "postgres" in servers:
        for b in (*EQUAL_BATCHES, args.batch_steps):
            ratio(f"runyard SQLite / PostgreSQL at {b}-step batches",
                  f"runyard sqlite, {b}-step batches", f"runyard postgres, {b}-step batches")
    for label, value in ratios.items():
        print(f"{label}: {value:.2f}x (median of per-repetition ratios)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps({"reps": args.reps, "points_per_rep": args.steps * 80, "median_points_per_s": medians,
                      "ratios": ratios}))
    print_rows(results, list(servers), args.batch_steps, args.reps, load_at_start)


if __name__ == "__main__":
    main()
