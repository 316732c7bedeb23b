"""One alert pass (orchestrator/alerts/engine.py) on a SQLite database seeded with finished and
running runs: what the scheduler's ``alerts`` job costs every 5 s, on its own thread.

    .venv/bin/python bench/bench_alerts.py --finished 1000 --running 20 --repeats 5

Each running run has 100 logged steps of ``loss`` and ``step_time`` on 2 ranks; every run's
status changes are recent (the first pass after a start looks back 10 minutes). Ends with its
BENCHMARKS.md row (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchmarks_row import load_average, print_row
from db.engine import make_engine, make_sessionmaker, upgrade
from db.metricstore import write_points
from db.models import Attempt
from db.requests import create_run
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from orchestrator.alerts.engine import AlertEngine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--finished", type=int, default=1000)
    parser.add_argument("--running", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    load_at_start = load_average()
    home = Path(tempfile.mkdtemp())
    url = f"sqlite:///{home / 'runyard.db'}"
    upgrade(url)
    sessions = make_sessionmaker(make_engine(url))
    now = time.time()
    with sessions() as s:
        for i in range(args.finished + args.running):
            run = create_run(s, RunConfig(name=f"r{i}"), home / "runs", Price(usd_per_hour=1.0, unit="x"))
            s.flush()
            active = i >= args.finished
            path = [RunStatus.STARTING, RunStatus.RUNNING] + ([] if active else [RunStatus.SUCCEEDED])
            for status in path:
                transition(s, run.id, status, "bench")
            s.add(Attempt(run_id=run.id, number=1, status="RUNNING" if active else "SUCCEEDED", dir="/x",
                          started_at=now - 3600, first_step_at=now - 3500, progress_at=now - 1, last_step=1000,
                          ended_at=None if active else now - 10))
            s.flush()
            if active:
                write_points(s.connection(), [
                    dict(run_id=run.id, attempt=1, rank=r, step=step, key=k, value=1.0, wall_time=now - 100 + step / 10)
                    for step in range(10, 1010, 10) for r in (0, 1) for k in ("loss", "step_time")])
        s.commit()
    engine = AlertEngine(sessions, home, started_at=now)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        engine.evaluate()
        times.append(time.perf_counter() - t0)
    print(f"{args.finished} finished + {args.running} running runs: one alert pass, median "
          f"{statistics.median(times) * 1000:.0f} ms (min {min(times) * 1000:.0f}, first {times[0] * 1000:.0f})")
    print_row("One alert pass", f"the scheduler's alerts job (every 5 s) over {args.finished:,} finished runs and the "
              "running ones", f"**{statistics.median(times) * 1000:.0f} ms** "
              f"with {args.running} running runs (min {min(times) * 1000:.0f}, first {times[0] * 1000:.0f}); median of "
              f"{args.repeats}", load_at_start)


if __name__ == "__main__":
    main()
