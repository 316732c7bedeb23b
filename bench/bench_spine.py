"""Submit-to-first-step and submit-to-SUCCEEDED of the default 2-rank mlp-digits run, each beside
the floor: a bare torchrun start of the same DDP step (bench/floor.py).

    .venv/bin/python bench/bench_spine.py [--runs 5] [--cold]

``--cold`` runs each repetition a second time with ``launch.warm_start = false`` (every rank a
fresh interpreter, trainer/agent/warm.py), side by side, and prints both; ``cpu`` is the machine's busy
CPU-seconds from submit to SUCCEEDED (/proc/stat), the rest of the machine being idle.

Each repetition uses a fresh data folder, a real `runyard scheduler` and `runyard submit` of
examples/digits.toml; times come from the database (run created_at, the attempt's
first_step_at and the run's ended_at), so polling does not blur them, except ``cli_to_first_step``:
from the wall clock just before the `runyard submit` process starts (the CLI's own start-up
included) to the first step. Then the floor runs, with nothing else of runyard's running (the
scheduler stopped). Prints medians, the ratio cli_to_first_step / floor against the 1.15x
target, the attempt's start-up phases (db/vocabulary/phases.py) and the load average, and ends with
its BENCHMARKS.md row (bench/benchmarks_row.py).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarks_row import load_average, print_row, verdict
from floor import busy_cpu_s, floor_start

from db.vocabulary.phases import attempt_phases, marks_from_json

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.15


def one_run(home: Path, config: Path) -> dict[str, float]:
    env = dict(os.environ, RUNYARD_HOME=str(home))
    env.pop("RUNYARD_DB_URL", None)
    runyard = [sys.executable, "-m", "orchestrator"]
    subprocess.run([*runyard, "db", "upgrade"], env=env, check=True, capture_output=True)
    sched = subprocess.Popen([*runyard, "scheduler"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)  # let the scheduler come up: we time the run, not the scheduler's start
        cli_started, cpu_started = time.time(), busy_cpu_s()
        out = subprocess.run([*runyard, "submit", str(config)], env=env, check=True,
                             capture_output=True, text=True).stdout
        run_id = int(out.strip())
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            con = sqlite3.connect(home / "runyard.db")
            row = con.execute(
                "SELECT r.status, r.created_at, r.ended_at, a.started_at, a.first_step_at, a.phase_marks_json "
                "FROM runs r "
                "LEFT JOIN attempts a ON a.run_id = r.id WHERE r.id = ?", (run_id,)
            ).fetchone()
            con.close()
            if row and row[0] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                status, created, ended, launched, first, marks = row
                if status != "SUCCEEDED":
                    raise RuntimeError(f"run ended {status}")
                attempt = {"started_at": launched, "first_step_at": first, "phase_marks": marks_from_json(marks)}
                phases = {p["phase"]: p["seconds"] for p in attempt_phases(attempt, None) or []}
                print("  phases: " + "  ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
                cpu_ended = busy_cpu_s()
                cpu = cpu_ended - cpu_started if cpu_ended is not None and cpu_started is not None else float("nan")
                return {"cpu": cpu, "cli_to_created": created - cli_started,
                        "submit_to_launch": launched - created,
                        "submit_to_first_step": first - created, "cli_to_first_step": first - cli_started,
                        "submit_to_succeeded": ended - created}
            time.sleep(0.2)
        raise RuntimeError("run did not finish in 300 s")
    finally:
        sched.send_signal(signal.SIGTERM)
        sched.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="each repetition also with launch.warm_start = false")
    args = parser.parse_args()
    load_at_start = load_average()
    digits = ROOT / "examples" / "digits.toml"
    results, colds = [], []
    with tempfile.TemporaryDirectory(prefix="runyard-bench-") as tmp:
        cold_config = Path(tmp) / "digits-cold.toml"
        cold_config.write_text(digits.read_text().replace("[launch]\n", "[launch]\nwarm_start = false\n"))
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="runyard-bench-") as home:
                r = one_run(Path(home), digits)
            if args.cold:
                with tempfile.TemporaryDirectory(prefix="runyard-bench-") as home:
                    colds.append(one_run(Path(home), cold_config))
                print(f"run {i + 1} cold: " + ", ".join(f"{k} {v:.2f} s" for k, v in colds[-1].items()), flush=True)
            r["floor"] = floor_start(2)  # side by side, the scheduler stopped
            r["ratio"] = r["cli_to_first_step"] / r["floor"]
            results.append(r)
            print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in r.items()), flush=True)
    medians = {k: statistics.median(r[k] for r in results) for k in results[0]}
    if colds:
        cold = {k: statistics.median(r[k] for r in colds) for k in colds[0]}
        print("median cold: " + ", ".join(f"{k} {v:.2f} s" for k, v in cold.items()))
    print("median: " + ", ".join(f"{k} {v:.2f} s" for k, v in medians.items()))
    ratio = medians["cli_to_first_step"] / medians["floor"]
    print(f"runyard submit -> first step {medians['cli_to_first_step']:.2f} s, bare torchrun {medians['floor']:.2f} s: "
          f"{ratio:.2f}x (median of ratios {medians['ratio']:.2f}x); target <= {TARGET_RATIO}x: "
          f"{'PASS' if ratio <= TARGET_RATIO else 'MISS'}; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(json.dumps({"runs": args.runs, "median_s": medians, "ratio": ratio}))
    result = (f"{medians['cli_to_first_step']:.2f} s against the floor's {medians['floor']:.2f} s: **{ratio:.2f}x** "
              f"(target <= {TARGET_RATIO}x: {verdict(ratio <= TARGET_RATIO)}); submit -> SUCCEEDED "
              f"{medians['submit_to_succeeded']:.2f} s")
    if colds:
        result += (f"; cold ranks {cold['cli_to_first_step']:.2f} s "
                   f"({cold['cli_to_first_step'] / medians['floor']:.2f}x)")
    print_row("Submit to first step", "`runyard submit` to the first step of the default 2-rank run, beside a "
              "bare torchrun start (the floor)", result + f"; medians of {args.runs}",
              load_at_start)


if __name__ == "__main__":
    main()
