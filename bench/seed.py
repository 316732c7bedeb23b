"""Seed a database with a finished run and its metric points, through rank 0's write path.

    .venv/bin/python bench/seed.py sqlite:////tmp/seeded/runyard.db --ranks 8 --steps 100000 [--keys loss,lr]

:func:`seed_run` is what the chart-query, first-render and browser benchmarks and tests use: a
SUCCEEDED run of one attempt, ``keys`` logged on every rank at steps 1..``steps`` (a decaying
loss-like curve with noise, one NaN on rank 3 half-way), written with ``db.metricstore.write_points``
in batches, rollups included. Prints the run id.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import socket

from sqlalchemy import insert, select

from db.engine import make_engine, make_sessionmaker, upgrade
from db.metricstore import write_points
from db.models import Attempt, Run, SystemMetric
from db.requests import create_run
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price

STEP_S = 0.05  # seconds per step of the seeded run


def values(rank: int, step: int, steps: int, key_index: int, rng: random.Random) -> float:
    """A loss-like curve: decays over the run, a little apart per rank and key, with noise."""
    return 3.0 * math.exp(-5 * step / steps) + 0.1 + 0.02 * rank + 0.1 * key_index + 0.05 * rng.random()


def seed_system_metrics(db_url: str, run_id: int, gpus: int) -> int:
    """The scheduler's 10-s system rows for the whole of a finished run, as sysmon writes them
    for a run on ``gpus`` GPUs (one rank each): per GPU the seven NVML series, per rank and for
    the whole tree the process CPU and RSS, and the host's seven series. Returns rows written."""
    rng = random.Random(run_id)
    engine = make_engine(db_url)
    host = socket.gethostname()
    gpu_keys = [("util_percent", 95.0), ("mem_used_bytes", 60e9), ("mem_total_bytes", 80e9), ("power_w", 600.0),
                ("power_limit_w", 700.0), ("temp_c", 70.0), ("sm_clock_mhz", 1980.0)]
    host_keys = [("cpu_percent", 60.0), ("mem_used_bytes", 200e9), ("mem_total_bytes", 1e12), ("disk_read_bps", 1e6),
                 ("disk_write_bps", 5e7), ("net_sent_bps", 1e5), ("net_recv_bps", 1e5)]
    written = 0
    try:
        with engine.begin() as conn:
            start, end = conn.execute(select(Run.started_at, Run.ended_at).where(Run.id == run_id)).one()
            assert start is not None and end is not None, f"run {run_id} has not run"
            series: list[tuple[str, int | None, int | None, str, float]] = [
                (f"gpu{g}", run_id, g, key, base) for g in range(gpus) for key, base in gpu_keys]
            series += [("procs", run_id, r, key, base) for r in [*range(gpus), None]
                       for key, base in (("cpu_percent", 100.0), ("rss_bytes", 4e9))]
            series += [("host", None, None, key, base) for key, base in host_keys]
            at = math.floor(start / 10) * 10.0
            while at < end:
                rows = []
                for device, run, rank, key, base in series:
                    value = base if key.endswith(("total_bytes", "limit_w")) else base * rng.uniform(0.97, 1.03)
                    rows.append({"at": at, "host": host, "device": device, "run_id": run, "rank": rank, "key": key,
                                 "min": value * 0.98, "mean": value, "max": value * 1.02, "count": 5})
                conn.execute(insert(SystemMetric), rows)
                written += len(rows)
                at += 10.0
    finally:
        engine.dispose()
    return written


def point_batches(run_id: int, ranks: int, steps: int, keys: Sequence[str], batch_points: int,
                  start: float, seed: int = 0) -> Iterator[list[dict[str, Any]]]:
    """The run's points as rank 0's writer hands them over: step by step, every rank, every key."""
    rng = random.Random(seed)
    per_step = ranks * len(keys)
    batch_steps = max(1, batch_points // per_step)
    for first in range(1, steps + 1, batch_steps):
        yield [
            {"run_id": run_id, "attempt": 1, "rank": rank, "step": step, "key": key,
             "value": math.nan if (rank, step) == (3, steps // 2) else values(rank, step, steps, k, rng),
             "wall_time": start + step * STEP_S}
            for step in range(first, min(steps, first + batch_steps - 1) + 1)
            for k, key in enumerate(keys)
            for rank in range(ranks)
        ]


def create_finished_run(db_url: str, name: str, ranks: int, steps: int, runs_dir: Path | None = None,
                        start: float | None = None) -> int:
    """A SUCCEEDED run with one attempt of ``steps`` steps on ``ranks`` ranks that started at
    ``start`` (default: so that it just ended), and no points."""
    if runs_dir is None:
        database = make_engine(db_url).url.database
        if not database:
            raise ValueError(f"pass runs_dir: {db_url!r} is not a SQLite file")
        runs_dir = Path(database).parent / "runs"
    engine = make_engine(db_url)
    start = time.time() - steps * STEP_S - 60 if start is None else start
    try:
        with make_sessionmaker(engine)() as s:
            config = RunConfig.model_validate({"name": name, "train": {"max_steps": steps}})
            run = create_run(s, config, runs_dir, Price(usd_per_hour=1.0, unit="seeded"))
            s.flush()
            for status in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED):
                transition(s, run.id, status, "seeded by bench/seed.py")
            end = start + steps * STEP_S
            run.nproc, run.started_at, run.ended_at = ranks, start, end
            s.add(Attempt(run_id=run.id, number=1, status="SUCCEEDED", dir=str(Path(run.run_dir) / "attempts" / "1"),
                          started_at=start, ended_at=end, first_step_at=start + STEP_S, progress_at=end,
                          last_step=steps, resume_step=0))
            s.commit()
            return run.id
    finally:
        engine.dispose()


def seed_run(db_url: str, ranks: int = 8, steps: int = 100_000, keys: Sequence[str] = ("loss",), *,
             name: str = "seeded", runs_dir: Path | None = None, batch_points: int = 50_000,
             progress: bool = False) -> int:
    """Create a finished run and write ``ranks x steps x len(keys)`` points through
    ``write_points`` (one transaction per batch of about ``batch_points``).

    Args:
        db_url: A database already upgraded to the newest schema.
        ranks: Ranks of the run.
        steps: Steps 1..steps are logged on every rank.
        keys: Metric names.
        name: The run's name.
        runs_dir: Where the run folder goes (default: ``runs/`` beside a SQLite file).
        batch_points: Points per write.
        progress: Print progress to stderr every 10%.

    Returns:
        The run id.
    """
    start = time.time() - steps * STEP_S - 60
    run_id = create_finished_run(db_url, name, ranks, steps, runs_dir, start)
    engine = make_engine(db_url)
    total, written, shown, t0 = ranks * steps * len(keys), 0, 0, time.monotonic()
    try:
        for rows in point_batches(run_id, ranks, steps, keys, batch_points, start, seed=run_id):
            with engine.begin() as conn:
                write_points(conn, rows)
            written += len(rows)
            if progress and written * 10 // total > shown:
                shown = written * 10 // total
                rate = written / max(1e-9, time.monotonic() - t0)
                print(f"  seeded {written:,}/{total:,} points ({rate:,.0f}/s)", file=sys.stderr, flush=True)
    finally:
        engine.dispose()
    return run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db_url")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--keys", default="loss")
    parser.add_argument("--name", default="seeded")
    args = parser.parse_args()
    upgrade(args.db_url)
    print(seed_run(args.db_url, args.ranks, args.steps, args.keys.split(","), name=args.name, progress=True))


if __name__ == "__main__":
    main()
