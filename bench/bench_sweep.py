"""Sweeps (issue 54): the gap between trials, ASHA against random search, parameter importance's time.

    .venv/bin/python bench/bench_sweep.py [--repeats 4] [--runs 3] [--seeds 9] [--importance-repeats 7] [--quick]

``--quick`` (one repetition of two runs of ``submit`` and ``sweep``, 3 seeds, 3 importance calls)
checks that every part runs, in about a minute (62 s at a load of 3, about three minutes at 6, where
a launch's start-up doubles); its single gap a kind is no measurement. A part given 0
(``--repeats 0``, ``--seeds 0``, ``--importance-repeats 0``) is skipped.

1. **The gap between trials** (real scheduler, real torchrun): one RUNYARD_HOME, one `runyard
   scheduler` with RUNYARD_CPU_SLOTS=1 and 1-rank mlp-digits runs of 50 steps, so that runs queue
   one after another. Three kinds take turns, ``--repeats`` times, each a block of ``--runs``
   runs of the same config: ``submit``, ``--runs`` bare `runyard submit`s at once (the next run
   waits QUEUED: the floor); ``sweep``, a random sweep of ``--runs`` trials with max_concurrent = 1
   (the next trial is made by the scheduler's ``sweeps`` job once the one before has ended: the
   tick that settles it brings the job forward, and the job's pass brings the tick forward);
   ``sweep-ahead``, the same with max_concurrent = 2 (the next trial is made while the one before
   trains and waits QUEUED for the slot). From the database (this machine's time.time()
   clocks, so polling does not blur them), for each run and the one before it: ``gap`` = its
   attempt's first_step_at - the one before's ended_at (the exit the shim recorded), split into
   ``notice`` (the one before's detected_at - ended_at: the scheduler sees the exit), ``made``
   (the run's created_at - detected_at; below 0 when it was queued ahead), ``launch`` (its
   attempt's started_at - the later of the two), ``handoff`` (started_at - the one before's
   ended_at: the scheduler's whole part) and ``start`` (its first step - started_at: torchrun's and
   the trainer's, the same for every kind but for the machine's noise).
   Medians over every gap of a kind, and each sweep kind's median against submit's.
2. **ASHA against random search with the same GPU time** (bench/sweep_sim.py: runyard's own
   searcher, rungs, cut, promotion and decision table driven over a deterministic toy learning
   curve on a simulated clock; no process is started): for each of ``--seeds`` seeds, the 27-trial
   ASHA sweep of examples/sweep.toml with the random searcher, then random search without early
   stopping given the GPU time ASHA spent: the best objective each reached (finished trials), and
   the GPU time each needed to reach the worse of the two bests. Medians over the seeds.
3. **Parameter importance on 300 synthetic trials** (orchestrator/sweeps/importance.py; the
   issue's target: under 1 s): the first call in this process (it imports scikit-learn) apart,
   then the median of ``--importance-repeats`` calls.

Prints each measurement, the load average, a JSON summary, and last the BENCHMARKS.md row of each
part that ran (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarks_row import load_average, print_row, verdict
from sweep_sim import TOYS, Clock, compare, example, rank_agreement

from orchestrator.sweeps import asha
from orchestrator.sweeps.importance import importance

KINDS = ("submit", "sweep", "sweep-ahead")
STEPS = 50
BASE = f"""name = "gap"
[workload]
kind = "mlp-digits"
[launch]
nproc_per_node = 1
[train]
max_steps = {STEPS}
log_every = 10
eval_every = {STEPS}
"""
SWEEP = """
[sweep]
metric = "loss"
searcher = "random"
max_trials = {runs}
max_concurrent = {concurrent}
[sweep.space]
"train.lr" = {{log_uniform = [1e-3, 1e-2]}}
"""
PARTS = ("notice", "made", "launch", "handoff", "start", "gap")
IMPORTANCE_TARGET_S = 1.0


class BenchError(RuntimeError):
    pass


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# -- part 1: the gap between trials -------------------------------------------------------------


class Home:
    """A runyard data folder with its scheduler as a subprocess, one CPU slot."""

    def __init__(self, path: Path) -> None:
        self.path, self.db = path, path / "runyard.db"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
        self.env.update(RUNYARD_HOME=str(path), RUNYARD_CPU_SLOTS="1")
        self.scheduler: subprocess.Popen[bytes] | None = None

    def cli(self, *args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "orchestrator", *args], env=self.env, capture_output=True,
                                text=True, timeout=120)
        if result.returncode != 0:
            raise BenchError(f"runyard {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    def start(self) -> None:
        self.cli("db", "upgrade")
        log = (self.path / "scheduler.log").open("ab")
        self.scheduler = subprocess.Popen([sys.executable, "-m", "orchestrator", "scheduler"], env=self.env,
                                          stdout=log, stderr=subprocess.STDOUT)
        log.close()  # the child holds its own copy
        while not (self.path / "scheduler.json").exists():  # its first heartbeat
            if self.scheduler.poll() is not None:
                raise BenchError(f"the scheduler exited {self.scheduler.returncode}: {self.log_tail()}")
            time.sleep(0.1)

    def close(self) -> None:
        """SIGTERM the scheduler, then SIGKILL any training process of this home still there (an
        interrupted block's)."""
        if self.scheduler is not None and self.scheduler.poll() is None:
            self.scheduler.send_signal(signal.SIGTERM)
            try:
                self.scheduler.wait(30)
            except subprocess.TimeoutExpired:
                self.scheduler.kill()
                self.scheduler.wait(10)
        left = []
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error, OSError):
                run_dir = proc.environ().get("RUNYARD_RUN_DIR", "")
                if run_dir.startswith(str(self.path) + os.sep) and proc.pid != os.getpid():
                    proc.send_signal(signal.SIGKILL)
                    left.append(proc)
        psutil.wait_procs(left, timeout=10)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return (self.path / "scheduler.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        con = sqlite3.connect(self.db, timeout=10)
        try:
            return con.execute(sql, params).fetchall()
        finally:
            con.close()

    def wait(self, what: str, done: Any, timeout: float = 300.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                found = done()
            except sqlite3.OperationalError:  # locked for longer than the timeout: look again
                found = None
            if found:
                return found
            time.sleep(0.2)
        raise BenchError(f"{what}: not within {timeout:.0f} s\n--- scheduler log (tail) ---\n{self.log_tail()}")


def block(home: Home, kind: str, runs: int, folder: Path) -> list[int]:
    """``runs`` runs of one kind, one after another on the one slot; their ids once all SUCCEEDED."""
    base = folder / "base.toml"
    base.write_text(BASE)
    if kind == "submit":
        ids = [int(home.cli("submit", str(base)).strip()) for _ in range(runs)]
    else:
        sweep = folder / f"{kind}.toml"
        sweep.write_text(BASE + SWEEP.format(runs=runs, concurrent=1 if kind == "sweep" else 2))
        sweep_id = int(home.cli("sweep", "start", str(sweep)).strip())
        home.wait(f"sweep {sweep_id} finished", lambda: home.query(
            "SELECT 1 FROM sweeps WHERE id = ? AND status = 'FINISHED'", (sweep_id,)))
        ids = [r[0] for r in home.query("SELECT run_id FROM sweep_trials WHERE sweep_id = ? ORDER BY number",
                                        (sweep_id,))]
        if len(ids) != runs or None in ids:
            raise BenchError(f"sweep {sweep_id} made runs {ids}, not {runs} runs")
    marks = ",".join("?" * len(ids))

    def settled() -> list[tuple[Any, ...]] | None:
        rows = home.query(f"SELECT id, status FROM runs WHERE id IN ({marks})", tuple(ids))
        return rows if len(rows) == runs and all(s in ("SUCCEEDED", "FAILED", "CANCELLED") for _, s in rows) else None

    rows = home.wait(f"{kind}: runs {ids} ended", settled)
    if any(status != "SUCCEEDED" for _, status in rows):
        raise BenchError(f"{kind}: runs ended {rows}, not all SUCCEEDED")
    return ids


def gaps(home: Home, ids: list[int]) -> list[dict[str, float]]:
    """Each run's gap after the run before it on the slot (module docstring, part 1)."""
    marks = ",".join("?" * len(ids))
    rows = home.query(
        "SELECT r.created_at, a.started_at, a.first_step_at, a.ended_at, a.detected_at FROM runs r "
        f"JOIN attempts a ON a.run_id = r.id AND a.number = 1 WHERE r.id IN ({marks}) ORDER BY a.started_at",
        tuple(ids))
    found = []
    for before, after in itertools.pairwise(rows):
        created, started, first_step = after[:3]
        ended, detected = before[3:]
        if started < ended:
            raise BenchError(f"runs {ids} overlapped on the one slot: did RUNYARD_CPU_SLOTS=1 hold?")
        found.append({"notice": detected - ended, "made": created - detected,
                      "launch": started - max(created, detected), "handoff": started - ended,
                      "start": first_step - started,
                      "gap": first_step - ended})
    return found


def gap_part(repeats: int, runs: int, kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="runyard-bench-", ignore_cleanup_errors=True) as tmp:
        home = Home(Path(tmp) / "home")
        try:
            home.start()
            for r in range(repeats):
                for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:  # each kind first in turn
                    found = gaps(home, block(home, kind, runs, Path(tmp)))
                    results[kind] += found
                    print(f"repeat {r + 1} {kind}: " + "; ".join(
                        ", ".join(f"{p} {g[p]:.2f}" for p in PARTS) for g in found), flush=True)
        finally:
            home.close()
    medians = {kind: {p: statistics.median(g[p] for g in found) for p in PARTS} for kind, found in results.items()}
    for kind, m in medians.items():
        print(f"{kind:12s} median of {len(results[kind])} gaps: " + ", ".join(f"{p} {m[p]:.2f} s" for p in PARTS))
    floor = medians["submit"]["gap"]
    ratios = {kind: medians[kind]["gap"] / floor for kind in kinds}
    print("against submit: " + ", ".join(f"{kind} {ratios[kind]:.2f}x" for kind in kinds[1:]) + "; load average "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
    return {"gaps": len(results["submit"]), "median_s": medians, "ratio": ratios}


# -- part 2: ASHA against random search (bench/sweep_sim.py) ----------------------------------------


def asha_part(seeds: int, clock: Clock, toy: str) -> dict[str, Any]:
    base, section = example(0, early_stop=True)
    rungs = asha.base_rungs(base, section.early_stop)
    agreement = rank_agreement(toy, rungs, asha.trial_steps(base))
    print(f"-- the {toy} toy: rank correlation with the end at the rungs "
          + ", ".join(f"step {step} {r:.2f}" for step, r in zip(rungs, agreement, strict=True)), flush=True)
    rows = []
    for seed in range(seeds):
        c = compare(seed, clock, toy)
        ours, plain = c["asha"], c["random"]
        rows.append({"asha_best": ours.best, "random_best": plain.best, "gpu_h": ours.gpu_s / 3600,
                     "random_gpu_h": plain.gpu_s / 3600, "asha_trials": ours.trials, "random_trials": plain.trials,
                     "asha_finished": len(ours.finished), "random_finished": len(plain.finished),
                     "promotions": ours.promotions, "target": c["target"],
                     "asha_to_target_h": c["asha_gpu_s_to_target"] / 3600,
                     "random_to_target_h": c["random_gpu_s_to_target"] / 3600})
        r = rows[-1]
        r["speedup"] = r["random_to_target_h"] / r["asha_to_target_h"]
        print(f"seed {seed}: ASHA best {r['asha_best']:.4f} ({r['asha_trials']} trials, {r['asha_finished']} "
              f"trained to the end, {r['promotions']} promoted, {r['gpu_h']:.3f} GPU-h); random best "
              f"{r['random_best']:.4f} ({r['random_finished']} trials finished in {r['random_gpu_h']:.3f} GPU-h); "
              f"to {r['target']:.4f}: ASHA {r['asha_to_target_h']:.3f} GPU-h, random {r['random_to_target_h']:.3f} "
              f"({r['speedup']:.2f}x)", flush=True)
    medians = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    wins = sum(r["asha_best"] < r["random_best"] for r in rows)
    ties = sum(r["asha_best"] == r["random_best"] for r in rows)  # the same trial: both searchers draw it
    speedups = sorted(r["speedup"] for r in rows)
    print(f"medians of {seeds} seeds: " + ", ".join(f"{k} {v:.4g}" for k, v in medians.items())
          + f"; ASHA's best better in {wins} of {seeds}, the same in {ties}", flush=True)
    return {"toy": toy, "seeds": seeds, "clock": vars(clock), "median": medians, "asha_better": wins, "same": ties,
            "speedup_range": (speedups[0], speedups[-1]),
            "rank_agreement": dict(zip(rungs, agreement, strict=True)), "per_seed": rows}


# -- part 3: parameter importance, timed ------------------------------------------------------------


def synthetic(section: Any, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` trials of the example's space, their value depending on the rate most, the width a
    little, the decay not at all, with noise."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        params = {"train.lr": math.exp(rng.uniform(math.log(1e-4), math.log(1e-1))),
                  "workload.hidden": rng.choice([32, 64, 128, 256]), "train.weight_decay": rng.uniform(0.0, 0.1)}
        value = (math.log10(params["train.lr"]) + 2.3) ** 2 + 0.3 * (params["workload.hidden"] == 32)
        out.append({"params": params, "value": value + rng.gauss(0, 0.05)})
    assert set(out[0]["params"]) == set(section.space)
    return out


def importance_part(repeats: int, trials: int = 300) -> dict[str, Any]:
    section = example(0, early_stop=True)[1]
    rows = synthetic(section, trials)
    imported_before = "sklearn" in sys.modules
    started = time.perf_counter()
    shares = importance(section, rows)
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        importance(section, rows)
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    print(f"importance of {trials} trials: first call {first:.3f} s (scikit-learn "
          f"{'already' if imported_before else 'imported in it'}), then median {median:.3f} s of {repeats} "
          f"({', '.join(f'{t:.3f}' for t in times)}); target < {IMPORTANCE_TARGET_S:g} s: "
          f"{'PASS' if median < IMPORTANCE_TARGET_S else 'MISS'}; shares "
          + ", ".join(f"{k} {v:.2f}" for k, v in shares.items()), flush=True)
    return {"trials": trials, "first_s": first, "median_s": median, "repeats": repeats, "shares": shares}


# -- main -------------------------------------------------------------------------------------------


def print_rows(summary: dict[str, Any], load_at_start: float) -> None:
    """The BENCHMARKS.md row of each part that ran."""
    if "gap" in summary:
        g = summary["gap"]
        m, ratio = g["median_s"], g["ratio"]
        print_row("Between two trials", "one trial's end to the next trial's first step on one CPU slot, beside "
                  "the next of queued `runyard submit`s (the floor)",
                  f"a sweep (max_concurrent 1) **{m['sweep']['gap']:.2f} s** against submit's "
                  f"{m['submit']['gap']:.2f} s: **{ratio['sweep']:.2f}x**; the scheduler's part (end -> launch) "
                  f"{m['sweep']['handoff']:.2f} s against {m['submit']['handoff']:.2f} s (the next trial made by the "
                  f"`sweeps` job, brought forward by the tick that settled the one before)"
                  + (f"; max_concurrent 2, the next trial queued ahead: {m['sweep-ahead']['gap']:.2f} s "
                     f"({ratio['sweep-ahead']:.2f}x), end -> launch {m['sweep-ahead']['handoff']:.2f} s"
                     if "sweep-ahead" in m else "")
                  + f"; medians of {g['gaps']} gaps a kind", load_at_start)
    if "asha" in summary:
        sides = []
        for a in summary["asha"]:
            m = a["median"]
            agreement = "/".join(f"{r:.2f}" for r in a["rank_agreement"].values())
            low, high = a["speedup_range"]
            sides.append(f"{a['toy']} curves (rank correlation with the end at the rungs {agreement}): best "
                         f"eval_loss ASHA **{m['asha_best']:.3f}** against random search's {m['random_best']:.3f} "
                         f"in {m['gpu_h']:.2f} GPU-h (ASHA better in {a['asha_better']} of {a['seeds']} seeds, the "
                         f"same trial in {a['same']}); to reach the worse of the two, random search needs "
                         f"**{m['speedup']:.2f}x** ASHA's GPU time ({low:.2f}-{high:.2f}x)")
        print_row("ASHA against random search", "examples/sweep.toml's 27-trial ASHA sweep against random search "
                  "without early stopping given the same GPU time: runyard's decision code over two toy learning "
                  "curves on a simulated clock (no trial process)",
                  "; ".join(sides) + f"; medians of {summary['asha'][0]['seeds']} seeds", load_at_start)
    if "importance" in summary:
        i = summary["importance"]
        met = i["median_s"] < IMPORTANCE_TARGET_S
        print_row("Parameter importance", f"a random forest's importance over {i['trials']} synthetic trials "
                  "(the sweep page's)", f"**{i['median_s']:.3f} s** (target < {IMPORTANCE_TARGET_S:g} s: "
                  f"{verdict(met)}); the process's first call, importing scikit-learn, {i['first_s']:.2f} s; "
                  f"medians of {i['repeats']}", load_at_start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=4, help="blocks of each kind in part 1 (0 skips it)")
    parser.add_argument("--runs", type=int, default=3, help="runs a block (runs - 1 gaps)")
    parser.add_argument("--seeds", type=int, default=9, help="seeds in part 2 (0 skips it)")
    parser.add_argument("--step-s", type=float, default=Clock.step_s, help="part 2: a simulated step's seconds")
    parser.add_argument("--startup-s", type=float, default=Clock.startup_s,
                        help="part 2: a simulated launch's seconds to its first step")
    parser.add_argument("--importance-repeats", type=int, default=7, help="calls in part 3 (0 skips it)")
    parser.add_argument("--quick", action="store_true",
                        help="1 repeat of 2 runs (submit and sweep only), 3 seeds, 3 calls: about a minute, a check")
    args = parser.parse_args()
    kinds = KINDS
    if args.quick:
        args.repeats, args.runs, args.seeds, args.importance_repeats, kinds = 1, 2, 3, 3, KINDS[:2]
    load_at_start = load_average()
    signal.signal(signal.SIGTERM, _interrupt)
    summary: dict[str, Any] = {}
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    try:
        if args.importance_repeats > 0:  # first: scikit-learn's import is in its first call
            print("== parameter importance, timed ==", flush=True)
            summary["importance"] = importance_part(args.importance_repeats)
        if args.seeds > 0:
            print("== ASHA against random search with the same GPU time (simulated clock) ==", flush=True)
            clock = Clock(step_s=args.step_s, startup_s=args.startup_s)
            summary["asha"] = [asha_part(args.seeds, clock, toy) for toy in TOYS]
        if args.repeats > 0:
            print(f"== the gap between trials: {args.repeats} x {len(kinds)} blocks of {args.runs} runs ==",
                  flush=True)
            summary["gap"] = gap_part(args.repeats, args.runs, kinds)
    except KeyboardInterrupt:
        print("interrupted; the scheduler started here was stopped", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, default=str))
    print_rows(summary, load_at_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
