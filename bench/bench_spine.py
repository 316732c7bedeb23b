"""Submit-to-first-step and submit-to-SUCCEEDED of the default 2-rank mlp-digits run.

    .venv/bin/python bench/bench_spine.py [--runs 5]

Each repetition uses a fresh data folder, a real `runyard scheduler` and `runyard submit` of
examples/digits.toml; times come from the database (run created_at, the attempt's
first_step_at and the run's ended_at), so polling does not blur them. Prints medians.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(home: Path) -> dict[str, float]:
    env = dict(os.environ, RUNYARD_HOME=str(home))
    env.pop("RUNYARD_DB_URL", None)
    runyard = [sys.executable, "-m", "orchestrator"]
    subprocess.run([*runyard, "db", "upgrade"], env=env, check=True, capture_output=True)
    sched = subprocess.Popen([*runyard, "scheduler"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)  # let the scheduler come up: we time the run, not the scheduler's start
        out = subprocess.run([*runyard, "submit", str(ROOT / "examples" / "digits.toml")], env=env, check=True,
                             capture_output=True, text=True).stdout
        run_id = int(out.strip())
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            con = sqlite3.connect(home / "runyard.db")
            row = con.execute(
                "SELECT r.status, r.created_at, r.ended_at, a.started_at, a.first_step_at FROM runs r "
                "LEFT JOIN attempts a ON a.run_id = r.id WHERE r.id = ?", (run_id,)
            ).fetchone()
            con.close()
            if row and row[0] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                status, created, ended, launched, first = row
                if status != "SUCCEEDED":
                    raise RuntimeError(f"run ended {status}")
                return {"submit_to_launch": launched - created, "submit_to_first_step": first - created,
                        "submit_to_succeeded": ended - created}
            time.sleep(0.2)
        raise RuntimeError("run did not finish in 300 s")
    finally:
        sched.send_signal(signal.SIGTERM)
        sched.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    results = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="runyard-bench-") as tmp:
            r = one_run(Path(tmp))
            results.append(r)
            print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in r.items()), flush=True)
    medians = {k: statistics.median(r[k] for r in results) for k in results[0]}
    print("median: " + ", ".join(f"{k} {v:.2f} s" for k, v in medians.items()))
    print(json.dumps({"runs": args.runs, "median_s": medians}))


if __name__ == "__main__":
    main()
