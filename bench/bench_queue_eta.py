"""When a queued run starts (issue 55): the start estimates of 3 runs queued behind 2 running, against
the true starts, through the real scheduler and real torchrun.

    .venv/bin/python bench/bench_queue_eta.py [--steps 400] [--every 2] [--repeats 1]

One RUNYARD_HOME, one `runyard scheduler` with RUNYARD_CPU_SLOTS=2, five 1-rank mlp-digits runs
submitted at once: the first two take the two slots, the other three wait QUEUED. Their lengths
differ (``--steps`` times 1, 1.5, 1, 0.5 and 1), so which run each queued one starts after is not
simply the one before it. Every ``--every`` seconds until the last one starts, this process reads
each queued run's start estimate as the Runs list and `runyard ls` do (db/estimates.py
queue_starts, with the machine the scheduler published), and once each has started, its true start
(its first attempt's ``started_at``, when admission launched it). The error of a sample is
predicted minus true start (positive: it started earlier than said). Reported: the median and p90
of the absolute error over every sample that had a time, over the samples in the first and second
half of each run's wait, and how many samples had no time yet (the runs ahead had no pace yet and
no earlier run like them: "after run N, whose length is not known"). About three minutes with
``--steps 400`` (the last round's runs are killed once all have started).

Prints each sample, a JSON summary, and last its BENCHMARKS.md row (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sweep import BenchError, Home, _interrupt
from benchmarks_row import load_average, print_row

from db.engine import make_engine, make_sessionmaker
from db.estimates import published_machine, queue_starts
from db.vocabulary.settings import Settings

LENGTHS = (1.0, 1.5, 1.0, 0.5, 1.0)  # each run's steps, in --steps
CONFIG = """name = "queue-{n}"
[workload]
kind = "mlp-digits"
[launch]
nproc_per_node = 1
[train]
max_steps = {steps}
log_every = 10
eval_every = {steps}
"""


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def one_round(home: Home, folder: Path, steps: int, every: float, wait_for_end: bool) -> list[dict[str, Any]]:
    """Submit the five runs, sample the queued ones' estimates until all have started (and, with
    ``wait_for_end``, wait until all have ended); the samples with each run's true start."""
    ids = []
    folder.mkdir(parents=True, exist_ok=True)
    for n, length in enumerate(LENGTHS):
        config = folder / f"queue-{n}.toml"
        config.write_text(CONFIG.format(n=n, steps=max(20, round(steps * length))))
        ids.append(int(home.cli("submit", str(config)).strip()))
    settings = Settings(home=home.path, db_url=f"sqlite:///{home.db}")
    engine = make_engine(settings.db_url)
    sessions = make_sessionmaker(engine)
    samples: list[dict[str, Any]] = []
    submitted = time.time()
    try:
        while True:
            now = time.time()
            with sessions() as s:
                starts = queue_starts(s, now, published_machine(settings))
            for run_id, start in starts.items():
                samples.append({"run": run_id, "at": now, "predicted": start.at, "after_run": start.after_run,
                                "basis": start.basis})
                said = f"{start.at - now:6.1f} s from now" if start.at is not None else "no time"
                print(f"t={now - submitted:6.1f} run {run_id}: {said} ({start.basis})", flush=True)
            started = dict(home.query(
                f"SELECT run_id, started_at FROM attempts WHERE number = 1 AND run_id IN ({','.join('?' * len(ids))})",
                tuple(ids)))
            if len(started) == len(ids) and not starts:
                break
            if now - submitted > 600:
                raise BenchError(f"not every run started within 600 s: {started}\n{home.log_tail()}")
            time.sleep(every)
        if wait_for_end:  # the next round's runs would queue behind these otherwise
            home.wait("every run ended", lambda: all(
                status in ("SUCCEEDED", "FAILED", "CANCELLED")
                for (status,) in home.query(f"SELECT status FROM runs WHERE id IN ({','.join('?' * len(ids))})",
                                            tuple(ids))))
    finally:
        engine.dispose()
    for sample in samples:
        sample["true"] = started[sample["run"]]
    return samples


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The errors (module docstring) over all samples with a time, and by half of each run's wait."""
    first_seen = {s["run"]: min(x["at"] for x in samples if x["run"] == s["run"]) for s in samples}
    timed = [s for s in samples if s["predicted"] is not None]
    out: dict[str, Any] = {"samples": len(samples), "without_time": len(samples) - len(timed),
                           "queued_runs": len(first_seen)}
    halves = {"all": timed,
              "first_half": [s for s in timed if s["at"] - first_seen[s["run"]]
                             < (s["true"] - first_seen[s["run"]]) / 2],
              "second_half": [s for s in timed if s["at"] - first_seen[s["run"]]
                              >= (s["true"] - first_seen[s["run"]]) / 2]}
    for name, group in halves.items():
        errors = [abs(s["predicted"] - s["true"]) for s in group]
        signed = [s["predicted"] - s["true"] for s in group]
        out[name] = ({"n": len(errors), "median_abs_s": statistics.median(errors), "p90_abs_s": percentile(errors, 0.9),
                      "median_signed_s": statistics.median(signed)} if errors else {"n": 0})
    waits = [max(s["true"] for s in samples if s["run"] == r) - first_seen[r] for r in first_seen]
    out["median_wait_s"] = statistics.median(waits) if waits else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="a run's steps (times 1, 1.5, 1, 0.5, 1)")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of five runs")
    args = parser.parse_args(argv)
    load_at_start = load_average()
    signal.signal(signal.SIGTERM, _interrupt)
    samples: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="runyard-bench-", ignore_cleanup_errors=True) as tmp:
            home = Home(Path(tmp) / "home")
            home.env["RUNYARD_CPU_SLOTS"] = "2"
            try:
                home.start()
                for r in range(args.repeats):
                    samples += one_round(home, Path(tmp) / f"round-{r}", args.steps, args.every,
                                         wait_for_end=r + 1 < args.repeats)
                    print(f"round {r + 1}: {len(samples)} samples so far", flush=True)
            finally:
                home.close()
    except KeyboardInterrupt:
        print("interrupted; the scheduler started here was stopped", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    now = summarise(samples)
    print(json.dumps(now))
    nan = float("nan")
    result = (f"{args.repeats} x {now['queued_runs'] // args.repeats} queued runs, {now['all']['n']} samples with a "
              f"time ({now['without_time']} without): |predicted - true start| median "
              f"**{now['all'].get('median_abs_s', nan):.1f} s**, p90 **{now['all'].get('p90_abs_s', nan):.1f} s** "
              f"(first half of the wait: median {now['first_half'].get('median_abs_s', nan):.1f} s; second half: "
              f"{now['second_half'].get('median_abs_s', nan):.1f} s); median wait {now['median_wait_s']:.0f} s")
    print_row("Queue start estimates", "3 runs queued behind 2 running (2 CPU slots, real scheduler): the "
              "predicted start against the true one", result, load_at_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
