"""How long the scheduler takes to start, how much memory it holds, and how much CPU it uses idle.

    python bench/bench_scheduler_start.py [--repeats 7] [--idle-s 20] [--tree PATH ...]

Each repetition starts ``python -m orchestrator scheduler`` on a fresh data folder (a migrated
SQLite database made beforehand, so migrations are not timed) and measures the wall time until
the scheduler's heartbeat file ``scheduler.json`` first appears, then its resident memory (RSS)
at that moment and whether torch is loaded in it; with ``--idle-s S``, also the share of one core
it then uses over S seconds with no run (after 3 s to settle). ``--tree`` names another checkout of runyard
(for example ``git worktree add /tmp/before <commit>``) to compare with side by side: the trees
take turns, and medians are printed; last, its BENCHMARKS.md row (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from benchmarks_row import load_average, print_row

HERE = Path(__file__).resolve().parents[1]


def _env(tree: Path, home: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "RUNYARD_HOME": str(home), "RUNYARD_CPU_SLOTS": "1"}
    env.pop("RUNYARD_DB_URL", None)
    return env


def one(tree: Path, idle_s: float = 0.0) -> tuple[float, float, bool, float | None]:
    """Seconds to the first heartbeat, RSS in MiB then, whether torch was loaded, and the percent
    of one core used idle over ``idle_s`` seconds (None without)."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        subprocess.run([sys.executable, "-m", "orchestrator", "db", "upgrade"], env=_env(tree, home), cwd=tree,
                       check=True, capture_output=True)
        beat = home / "scheduler.json"
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "scheduler"], env=_env(tree, home), cwd=tree,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not beat.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"the scheduler of {tree} exited with {proc.returncode}")
                time.sleep(0.005)
            elapsed = time.perf_counter() - started
            p = psutil.Process(proc.pid)
            rss = p.memory_info().rss / 2**20
            torch = any("/torch/" in m.path for m in p.memory_maps())
            idle = None
            if idle_s > 0:
                time.sleep(3.0)
                before = p.cpu_times()
                time.sleep(idle_s)
                after = p.cpu_times()
                idle = 100 * (after.user + after.system - before.user - before.system) / idle_s
        finally:
            proc.terminate()
            proc.wait(30)
    return elapsed, rss, torch, idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--idle-s", type=float, default=0.0, help="also measure idle CPU over this many seconds")
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another runyard checkout")
    args = parser.parse_args()
    load_at_start = load_average()
    trees = [HERE, *args.tree]
    results: dict[Path, list[tuple[float, float, bool, float | None]]] = {t: [] for t in trees}
    for _ in range(args.repeats):
        for tree in trees:
            results[tree].append(one(tree, args.idle_s))
    sides = []
    for tree, rows in results.items():
        times, rss = [r[0] for r in rows], [r[1] for r in rows]
        print(f"{tree}: start to first heartbeat median {statistics.median(times):.2f} s "
              f"(min {min(times):.2f}, max {max(times):.2f}); RSS median {statistics.median(rss):.0f} MiB; "
              f"torch loaded: {any(r[2] for r in rows)}  ({len(rows)} runs)")
        idle = [r[3] for r in rows if r[3] is not None]
        if idle:
            print(f"    idle: median {statistics.median(idle):.2f}% of one core over {args.idle_s:g} s "
                  f"({', '.join(f'{x:.2f}' for x in idle)})")
        shown = "this checkout" if tree == HERE else f"the tree at {tree}"
        torch = "yes" if any(r[2] for r in rows) else "no"
        side = (f"{shown}: start **{statistics.median(times):.2f} s**, RSS {statistics.median(rss):.0f} MiB, "
                f"torch loaded: {torch}")
        sides.append(side + (f", idle **{statistics.median(idle):.2f}%** of a core" if idle else ""))
    print_row("Scheduler start and idle", "`runyard scheduler`: start to its first heartbeat, its RSS then, its "
              "CPU idle (`--idle-s`)", "; ".join(sides)
              + f"; medians of {args.repeats}", load_at_start)


if __name__ == "__main__":
    main()
