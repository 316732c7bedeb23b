"""Straggler alarms on healthy runs: how many a machine's own noise raises.

    .venv/bin/python bench/bench_straggler_alarms.py [--runs 2,4] [--steps 3000] [--load 0]
        [--set supervision.straggler_sustain_s=0]

A fresh data folder, a real `runyard scheduler`, and one healthy mlp-digits run per entry of
``--runs`` (its ranks on this machine), all at once, with nothing slowed on purpose; ``--load N``
adds N busy-looping processes beside them (the machine's other work). Printed: each run's
straggler episodes (warning events) per 1,000 steps, with the ranks named. Every episode is a
false alarm: no rank was made slow. ``--set`` passes config overrides to every run, for example
the rule before the sustain (``supervision.straggler_sustain_s=0``). Ends with its BENCHMARKS.md
row (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks_row import load_average, print_row

ROOT = Path(__file__).resolve().parents[1]
RUNYARD = [sys.executable, "-m", "orchestrator"]


def _spin() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="2,4", help="ranks of each run, comma-separated")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--load", type=int, default=0, help="busy-looping processes beside the runs")
    ap.add_argument("--set", action="append", default=[], help="a config override for every run")
    args = ap.parse_args()
    load_at_start = load_average()
    ranks = [int(r) for r in args.runs.split(",")]
    counted = []
    with tempfile.TemporaryDirectory(prefix="runyard-straggler-") as tmp:
        env = {**os.environ, "RUNYARD_HOME": str(Path(tmp) / "home"), "RUNYARD_CPU_SLOTS": str(sum(ranks))}
        env.pop("RUNYARD_DB_URL", None)
        ids = []
        for n in ranks:
            sets = [f"name=healthy-{n}-ranks", f"launch.nproc_per_node={n}", f"train.max_steps={args.steps}",
                    "train.eval_every=0", "checkpoint.every_steps=0", *args.set]
            out = subprocess.run([*RUNYARD, "submit", str(ROOT / "examples" / "digits.toml"),
                                  *[x for s in sets for x in ("--set", s)]],
                                 env=env, capture_output=True, text=True, check=True, cwd=ROOT)
            ids.append(int(out.stdout.strip()))
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
        for p in spinners:
            p.start()
        scheduler = subprocess.Popen([*RUNYARD, "scheduler"], env=env, cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        db = Path(tmp) / "home" / "runyard.db"
        try:
            while True:
                time.sleep(2)
                with sqlite3.connect(db) as con:
                    done = con.execute("SELECT count(*) FROM runs WHERE status IN "
                                       "('SUCCEEDED', 'FAILED', 'CANCELLED')").fetchone()[0]
                if done == len(ids):
                    break
            with sqlite3.connect(db) as con:
                for run_id, n in zip(ids, ranks, strict=True):
                    status, steps = con.execute("SELECT status, max_steps FROM runs WHERE id = ?", (run_id,)).fetchone()
                    found = [m for (m,) in con.execute(
                        "SELECT message FROM events WHERE run_id = ? AND kind = 'straggler' ORDER BY id", (run_id,))]
                    named = sorted({int(re.match(r"rank (\d+)", m)[1]) for m in found})  # type: ignore[index]
                    print(f"run {run_id}: {n} ranks, {status}, {len(found)} straggler alarms in {steps} steps "
                          f"({1000 * len(found) / steps:.1f} per 1,000 steps), ranks named: {named or '-'}")
                    counted.append(f"{n} ranks **{len(found)}** in {steps:,} steps "
                                   f"({1000 * len(found) / steps:.1f} per 1,000)")
        finally:
            scheduler.terminate()
            scheduler.wait(30)
            for p in spinners:
                p.terminate()
    print_row("Straggler false alarms", "straggler warnings on healthy runs at once (each one a false alarm)",
              "alarms: " + "; ".join(counted), load_at_start)


if __name__ == "__main__":
    main()
