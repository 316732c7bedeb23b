"""What one Runs-page refresh costs the database: SQL statements and milliseconds per
``db.run_list.list_runs`` call, for databases of 1, 10 and 200 runs.

    .venv/bin/python bench/bench_runs_list.py [--runs 1,10,200] [--repeats 21] [--call plain|page|search]

``--call`` picks the call: ``plain`` is ``list_runs(s)`` (``runyard ls``); ``page`` is what the Runs
page asks every 2 s, ``db.compare.runs_list`` (the summary metric columns too, sorted by best loss);
``search`` is the page's call with a search that matches a sixth of the runs by name.

Each size is seeded by :func:`seed_runs` into its own temporary SQLite file (removed at the end)
through the real writers (``create_run``, ``transition``, Attempt and Checkpoint rows,
``metricstore.write_points``): a mix of running, retried, retrying, succeeded, failed and queued
runs, with per-rank loss points on the live ones. Statements are counted with a
``before_cursor_execute`` listener on the engine; each call opens a new session (as the UI's
cached ``data.list_runs`` does every second). Prints the statements and the median and first
milliseconds per call (wall, and this process's CPU time, which SQLite's work is part of and
which a loaded machine disturbs less), the load average, one JSON line, and last its BENCHMARKS.md
row (bench/benchmarks_row.py).
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
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.benchmarks_row import load_average, print_row  # noqa: E402 - needs ROOT on sys.path
from db.compare import runs_list  # noqa: E402 - needs ROOT on sys.path
from db.engine import make_engine, make_sessionmaker, upgrade  # noqa: E402 - needs ROOT on sys.path
from db.metricstore import write_points  # noqa: E402 - needs ROOT on sys.path
from db.models import Attempt, Checkpoint  # noqa: E402 - needs ROOT on sys.path
from db.requests import create_run  # noqa: E402 - needs ROOT on sys.path
from db.run_list import RunFilter, list_runs  # noqa: E402 - needs ROOT on sys.path
from db.states import RunStatus, transition  # noqa: E402 - needs ROOT on sys.path
from db.vocabulary.config import RunConfig  # noqa: E402 - needs ROOT on sys.path
from db.vocabulary.cost import Price  # noqa: E402 - needs ROOT on sys.path

# What the i-th seeded run is, in turn: a live run first, so that even one run has metrics to
# project an ETA from.
KINDS = ("running", "succeeded", "retried", "queued", "failed", "retrying")
LOSS_EVERY = 10  # a loss point every 10 steps on each rank
RANKS = (0, 1)


def _loss_points(run_id: int, attempt: int, first: int, last: int, now: float) -> list[dict[str, Any]]:
    """Loss every LOSS_EVERY steps on each rank from ``first`` to ``last``, 5 steps a second up to ``now``."""
    return [{"run_id": run_id, "attempt": attempt, "rank": rank, "step": step, "key": "loss",
             "value": 2.0 / step + 0.01 * rank, "wall_time": now - (last - step) / 5}
            for step in range(first, last + 1, LOSS_EVERY) for rank in RANKS]


def seed_runs(session: Session, runs_dir: Path, count: int, now: float | None = None) -> list[int]:
    """Queue ``count`` runs and give each the attempts, checkpoints and metrics of its kind
    (``KINDS``, in turn); the caller commits.

    Args:
        session: Where to write.
        runs_dir: Where ``create_run`` writes each run's config.json.
        count: How many runs.
        now: The wall clock the seeded times lead up to (default: now).

    Returns:
        The new runs' ids, oldest first.
    """
    now = time.time() if now is None else now
    ids, points = [], []
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        config = RunConfig.model_validate({"name": f"{kind}-{i}", "tags": [kind], "train": {"max_steps": 300}})
        run = create_run(session, config, runs_dir, Price(usd_per_hour=1.0 + i % 3, unit="cpu-hour"))
        session.flush()
        ids.append(run.id)
        path = {"running": ("STARTING", "RUNNING"), "succeeded": ("STARTING", "RUNNING", "SUCCEEDED"),
                "retried": ("STARTING", "RUNNING"), "queued": (), "failed": ("STARTING", "RUNNING", "FAILED"),
                "retrying": ("STARTING", "RUNNING", "RETRYING")}[kind]
        for status in path:
            assert transition(session, run.id, RunStatus(status), f"seed: {status}", now=now - 900)
        attempt_dir = Path(run.run_dir) / "attempts"
        step = 20 + (i * 7) % 250
        if kind == "running":
            session.add(Attempt(run_id=run.id, number=1, status="RUNNING", dir=str(attempt_dir / "1"),
                                started_at=now - 600, first_step_at=now - 590, progress_at=now, last_step=step))
            points += _loss_points(run.id, 1, LOSS_EVERY, step, now)
        elif kind == "succeeded":
            session.add(Attempt(run_id=run.id, number=1, status="SUCCEEDED", dir=str(attempt_dir / "1"),
                                started_at=now - 900, first_step_at=now - 880, ended_at=now - 300, last_step=300))
            session.add(Checkpoint(run_id=run.id, attempt=1, step=300, path="/c/300", bytes=1, sha256="0",
                                   params_digest="0", blocked_s=1.0, total_s=2.0, created_at=now - 310))
        elif kind in ("retried", "retrying", "failed"):
            # A failure after a checkpoint, then (retried) a second attempt from it that is running.
            session.add(Attempt(run_id=run.id, number=1, status="FAILED", dir=str(attempt_dir / "1"),
                                started_at=now - 900, first_step_at=now - 890, ended_at=now - 500, last_step=130,
                                cause="PREEMPTED" if kind == "failed" else "SIGNAL", failed_at=now - 500))
            session.add(Checkpoint(run_id=run.id, attempt=1, step=100, path="/c/100", bytes=1, sha256="0",
                                   params_digest="0", blocked_s=1.0, total_s=2.0, created_at=now - 560))
            if kind != "retrying":
                session.add(Attempt(run_id=run.id, number=2, status="RUNNING" if kind == "retried" else "FAILED",
                                    dir=str(attempt_dir / "2"), started_at=now - 480, first_step_at=now - 470,
                                    progress_at=now, last_step=100 + step // 2, resume_step=100,
                                    ended_at=None if kind == "retried" else now - 100,
                                    cause=None if kind == "retried" else "USER_ERROR"))
                points += _loss_points(run.id, 2, 100 + LOSS_EVERY, 100 + step // 2, now)
    session.flush()
    write_points(session.connection(), points)
    return ids


def count_statements(engine: Engine) -> list[str]:
    """A list that collects every SQL statement ``engine`` sends from now on."""
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    return statements


def _call(call: str) -> Any:
    """The ``list_runs`` call that ``--call`` names, as a function of a session, and the number of
    runs it lists of ``count`` (None: every one)."""
    if call == "plain":
        return lambda s: list_runs(s)
    if call == "page":
        return lambda s: runs_list(s, sort="best_loss", descending=False)
    return lambda s: runs_list(s, where=RunFilter(search="retried"), sort="best_loss", descending=False)


def measure(count: int, repeats: int, workdir: Path, call: str = "plain") -> dict[str, Any]:
    """Seed ``count`` runs into a new database under ``workdir`` and time ``list_runs`` on it."""
    list_runs = _call(call)

    home = workdir / f"runs-{count}"
    url = f"sqlite:///{home / 'runyard.db'}"
    home.mkdir(parents=True)
    upgrade(url)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    with sessions() as s:
        seed_runs(s, home / "runs", count)
        s.commit()
    statements = count_statements(engine)
    times, cpu, counts = [], [], []
    for _ in range(repeats + 1):
        statements.clear()
        with sessions() as s:
            t0, c0 = time.perf_counter(), time.process_time()
            runs = list_runs(s)
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
        counts.append(len(statements))
        assert len(runs) == count if call != "search" else all(r["name"].startswith("retried") for r in runs)
    engine.dispose()
    return {"runs": count, "statements": max(counts), "first_ms": times[0], "median_ms": statistics.median(times[1:]),
            "median_cpu_ms": statistics.median(cpu[1:])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="1,10,200", help="comma-separated numbers of runs")
    parser.add_argument("--repeats", type=int, default=21, help="timed calls per size after the first")
    parser.add_argument("--call", choices=("plain", "page", "search"), default="plain", help="which call (see above)")
    args = parser.parse_args()
    load_at_start = load_average()
    workdir = Path(tempfile.mkdtemp(prefix="runyard-bench-runs-list-"))
    try:
        results = []
        for count in (int(n) for n in args.runs.split(",")):
            r = measure(count, args.repeats, workdir, args.call)
            results.append(r)
            print(f"{count:>4} runs: {r['statements']:>4} statements a call, median {r['median_ms']:7.2f} ms "
                  f"(CPU {r['median_cpu_ms']:7.2f} ms; first {r['first_ms']:7.2f} ms) over {args.repeats} calls",
                  flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps({"repeats": args.repeats, "call": args.call, "results": results}))
    sizes = [f"{r['runs']} run{'s' if r['runs'] != 1 else ''} **{r['median_cpu_ms']:.1f} ms of CPU** "
             f"({r['median_ms']:.1f} ms wall), {r['statements']} statements"
             for r in sorted(results, key=lambda r: -r["runs"])]
    print_row("Runs list", "one Runs-list read (`plain`: `runyard ls`; `page`: the Runs page's, every 2 s; "
              "`search`) by the number of runs",
              f"`{args.call}` call: " + "; ".join(sizes) + f"; medians of {args.repeats} calls", load_at_start)


if __name__ == "__main__":
    main()
