"""Record real runs for bench/bench_eta.py: each through a real `runyard scheduler` on this machine,
in a fresh temporary data folder, then every attempt's rank-0 (step, wall time) points, its times
and the run's state changes saved to one JSON file (bench/data/eta_runs.json), which bench_eta.py
replays offline.

    .venv/bin/python bench/eta_record.py [--out bench/data/eta_runs.json] [--only digits,retry] [--scale 1.0]

The recordings (each 1-2 minutes on a 2-core machine; --scale multiplies their steps):

- ``digits``: the built-in mlp-digits workload, 2 ranks (evaluation every 100 steps, checkpoints).
- ``gpt-char``: the built-in gpt-char workload, 2 ranks, a small model.
- ``eval-pauses``: bench/eta_script.py, a script that holds every rank 4 s for an evaluation every
  150 steps (a steady step of 30 ms otherwise).
- ``slowdown``: mlp-digits, and a second mlp-digits run submitted when the first is 35% done; both
  run at once (RUNYARD_CPU_SLOTS=4 on 2 cores), so the first slows down for the rest of its run.
- ``retry``: mlp-digits with the fault-injection switch (RUNYARD_FAULTS=1, RUNYARD_FAULT_RAISE=STEP@1)
  raising in attempt 1 at 45% of the steps; it is retried from its newest checkpoint after a
  10 s backoff (retry.backoff_s).

Points are as rank 0 logged them (every 20 steps for the built-ins, every 10 for the script), thinned
to at most MAX_POINTS per attempt (none of these recordings has more, so the replay sees what the
Runs list saw).
Every process started here is stopped on the way out (bench_recovery.Product.close).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_recovery import BenchError, Product

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits.toml"
SCRIPT = ROOT / "bench" / "eta_script.py"
OUT = ROOT / "bench" / "data" / "eta_runs.json"
MAX_POINTS = 500
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "PAUSED", "PRUNED")
ATTEMPT_COLUMNS = ("number", "status", "started_at", "first_step_at", "ended_at", "failed_at", "detected_at",
                   "cause", "resume_step", "last_step")


@dataclass
class Recording:
    """One recording: the runs to submit (config file, overrides), the scheduler's extra environment,
    and a second submission made once the first run has reached a share of its steps."""

    name: str
    what: str
    config: Path
    overrides: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    second_at: float | None = None  # submit the same config again at this share of the first's steps


def recordings(scale: float) -> list[Recording]:
    def steps(n: int) -> str:
        return str(max(100, int(n * scale)))

    # Rank 0 logs every 20 steps here: the window of 60 points the ETA projects from spans 1,200 steps.
    digits = ("launch.nproc_per_node=2", "checkpoint.every_steps=200", "train.log_every=20")
    return [
        Recording("digits", "built-in mlp-digits, 2 ranks", DIGITS, (*digits, f"train.max_steps={steps(6000)}")),
        Recording("gpt-char", "built-in gpt-char, 2 ranks, small model", DIGITS,
                  ("workload.kind=gpt-char", "workload.n_layer=1", "workload.n_embd=32", "workload.n_head=2",
                   "workload.block_size=32", "train.batch_size=16", "launch.nproc_per_node=2",
                   f"train.max_steps={steps(3000)}", "train.eval_every=500", "checkpoint.every_steps=500",
                   "name=gpt-char")),
        Recording("eval-pauses", "a script with a 4 s evaluation every 150 steps", DIGITS,
                  ("workload.kind=script", f"workload.script={SCRIPT}",
                   f'workload.args=["--steps", "{steps(1200)}", "--eval-every", "150", "--eval-s", "4"]',
                   f"workload.max_steps={steps(1200)}", "launch.nproc_per_node=2", "name=eval-pauses")),
        Recording("slowdown", "mlp-digits; a second run starts at 35%", DIGITS,
                  (*digits, f"train.max_steps={steps(6000)}"), env={"RUNYARD_CPU_SLOTS": "4"}, second_at=0.35),
        Recording("retry", "mlp-digits; attempt 1 raises at 45%, retried after a 10 s backoff", DIGITS,
                  (*digits, f"train.max_steps={steps(6000)}", "retry.backoff_s=10", "retry.backoff_max_s=10"),
                  env={"RUNYARD_FAULTS": "1", "RUNYARD_FAULT_RAISE": f"{int(int(steps(6000)) * 0.45)}@1"}),
    ]


def _thin(points: list[tuple[int, float]]) -> list[list[float]]:
    every = max(1, -(-len(points) // MAX_POINTS))
    kept = points[::every]
    if points and kept[-1] != points[-1]:
        kept.append(points[-1])
    return [[int(s), round(t, 3)] for s, t in kept]


def read_run(product: Product, run_id: int) -> dict[str, Any]:
    """What the replay needs of one run, read from the database."""
    q = product._query
    (name, status, max_steps, created_at, started_at, ended_at), = q(
        "SELECT name, status, max_steps, created_at, started_at, ended_at FROM runs WHERE id = ?", (run_id,))
    attempts = []
    for row in q(f"SELECT {', '.join(ATTEMPT_COLUMNS)} FROM attempts WHERE run_id = ? ORDER BY number", (run_id,)):
        a = dict(zip(ATTEMPT_COLUMNS, row, strict=True))
        pts = q("SELECT p.step, p.wall_time FROM metric_points p JOIN metric_names n ON n.id = p.name_id "
                "WHERE p.run_id = ? AND p.attempt = ? AND p.rank = 0 AND n.name = 'loss' ORDER BY p.step",
                (run_id, a["number"]))
        a["points"] = _thin([(int(s), float(t)) for s, t in pts])
        attempts.append(a)
    history = [[to, at] for to, at in q("SELECT to_status, at FROM run_status_history WHERE run_id = ? ORDER BY id",
                                        (run_id,))]
    checkpoints = [list(r) for r in q("SELECT step, attempt, created_at FROM checkpoints WHERE run_id = ? "
                                      "ORDER BY created_at", (run_id,))]
    return {"id": run_id, "name": name, "status": status, "max_steps": max_steps, "created_at": created_at,
            "started_at": started_at, "ended_at": ended_at, "history": history, "attempts": attempts,
            "checkpoints": checkpoints}


def record(rec: Recording, timeout: float = 600.0) -> list[dict[str, Any]]:
    """Run one recording to its end in a fresh data folder; its runs as :func:`read_run` reads them."""
    with tempfile.TemporaryDirectory(prefix="runyard-eta-", ignore_cleanup_errors=True) as tmp:
        product = Product(Path(tmp))
        product.env.update(rec.env)
        try:
            product.cli("db", "upgrade")
            submit = ["submit", str(rec.config)]
            for item in rec.overrides:
                submit += ["--set", item]
            ids = [int(product.cli(*submit).strip())]
            log = open(product.home / "scheduler.log", "ab")  # noqa: SIM115 - open for the scheduler's life
            product._log = log
            product.scheduler = subprocess.Popen([sys.executable, "-m", "orchestrator", "scheduler"], env=product.env,
                                                 stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                marks = ",".join("?" * len(ids))
                rows = product._query(f"SELECT id, status, max_steps FROM runs WHERE id IN ({marks})", tuple(ids))
                if rec.second_at is not None and len(ids) == 1 and rows:
                    attempts = product.attempts(ids[0])
                    step = attempts[-1]["last_step"] if attempts else None
                    if step is not None and step >= rec.second_at * rows[0][2]:
                        ids.append(int(product.cli(*submit, "--set", "name=second").strip()))
                        continue
                if rows and len(rows) == len(ids) and all(status in TERMINAL for _, status, _ in rows):
                    break
                if product.scheduler.poll() is not None:
                    raise BenchError(f"the scheduler exited:\n{product.scheduler_log_tail()}")
                time.sleep(0.2)
            else:
                raise BenchError(f"{rec.name}: not finished within {timeout:.0f} s")
            return [read_run(product, run_id) for run_id in ids]
        finally:
            product.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", default="", help="comma-separated recording names (default: all)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every recording's steps")
    args = parser.parse_args()
    wanted = {n for n in args.only.split(",") if n}
    existing = json.loads(args.out.read_text()) if args.out.exists() else {"recordings": {}}
    for rec in recordings(args.scale):
        if wanted and rec.name not in wanted:
            continue
        started, load = time.monotonic(), os.getloadavg()[0]
        print(f"recording {rec.name}: {rec.what} ...", flush=True)
        runs = record(rec)
        print(f"  {len(runs)} run(s), {time.monotonic() - started:.0f} s, status "
              f"{', '.join(r['status'] for r in runs)}", flush=True)
        existing["recordings"][rec.name] = {"what": rec.what, "runs": runs,
                                            "load": [round(load, 1), round(os.getloadavg()[0], 1)]}
    existing["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "recorded": time.strftime("%Y-%m-%d", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(existing, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
