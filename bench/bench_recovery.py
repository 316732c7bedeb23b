"""Recovery time after one rank is SIGKILLed, and goodput under a kill every minute.

    .venv/bin/python bench/bench_recovery.py [--injections 10] [--goodput-minutes 3] [--seed 0] [--set K=V]

``--set launch.warm_start=false`` (any config override, repeatable) times ranks started cold.

Each part uses a fresh data folder (a temporary RUNYARD_HOME), a real `runyard scheduler`
subprocess and `runyard submit` of examples/digits.toml with a huge train.max_steps,
checkpoint.every_steps=50 and retries without backoff (retry.max_retries=1000,
retry.backoff_s=0, retry.backoff_max_s=0). A kill is a SIGKILL to one rank process of the
current attempt (a process whose environment has LOCAL_RANK and RUNYARD_ATTEMPT = that attempt),
the rank chosen with a seeded random.

1. Recovery time, --injections times on one run: wait until the newest attempt has completed
   --min-steps (30) steps past its first step, plus a seeded random 0..19 more so that the
   kills fall at different places of the 50-step checkpoint cycle; record the wall time
   ``kill`` just before the SIGKILL; wait until the next attempt has a first step. From the
   database (time.time() clocks of this machine, so polling does not blur them):

       detect   = attempt.detected_at  - kill              (torchrun notices, tears down, exits;
                                                            the scheduler's tick sees it)
       relaunch = next.started_at      - attempt.detected_at  (retry policy, new attempt row)
       resume   = next.first_step_at   - next.started_at      (torchrun, rendezvous, checkpoint
                                                               load, first step)
       total    = next.first_step_at   - kill

   ``exit`` = attempt.failed_at - kill (the exit time the shim recorded for torchrun) is also
   printed: it is the part of ``detect`` before the scheduler could have seen anything.
   Medians and nearest-rank p95 of each; target (the issue): total median <= 8 s and
   p95 <= 15 s on a 2-core CPU machine, printed as PASS/MISS (never a failure exit).

2. Goodput under failures, on another run for --goodput-minutes: a rank is SIGKILLed every
   --kill-every (60) seconds after the first attempt was launched; at the end, runyard's own
   goodput (``runyard show RUN --json``, db/efficiency.goodput) and an independent one computed
   here from the database: (lineage steps x mean rank-0 step_time on the lineage) / (now - the
   first attempt's started_at). Then `runyard cancel RUN` and wait for CANCELLED.
   ``--kill-every 0`` runs it without kills: the baseline (checkpoints every 50 steps, evals and
   reporting are outside step_time, so goodput is below 1 even without failures).

Every process started here is stopped on the way out (also on Ctrl-C / SIGTERM): the scheduler
with SIGTERM, then every process whose environment has RUNYARD_RUN_DIR under the temporary home
(torchrun, the ranks, the shim) with SIGKILL. Then a JSON summary, and last the BENCHMARKS.md row
of each part that ran (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import contextlib
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
from floor import floor_start

from db.vocabulary.phases import attempt_phases, marks_from_json

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "digits.toml"
OVERRIDES = (
    "train.max_steps=1000000",
    "checkpoint.every_steps=50",
    "retry.max_retries=1000",
    "retry.backoff_s=0",
    "retry.backoff_max_s=0",
)
EXTRA: list[str] = []  # --set
ACTIVE = ("QUEUED", "STARTING", "RUNNING", "RETRYING", "CANCELLING", "PAUSING")
COMPONENTS = ("detect", "relaunch", "resume", "total")
TARGET_MEDIAN_S, TARGET_P95_S = 8.0, 15.0
POLL_S = 0.05

ATTEMPT_COLUMNS = ("number", "status", "started_at", "first_step_at", "last_step", "resume_step", "failed_at",
                   "detected_at", "ended_at", "cause", "failed_rank", "phase_marks_json")
TARGET_FLOOR_RATIO = 1.3


class BenchError(RuntimeError):
    pass


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile (with 10 values: the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class Product:
    """A runyard installation in a temporary folder, with its scheduler as a subprocess."""

    def __init__(self, home: Path, tree: Path | None = None):
        self.home = home
        self.db = home / "runyard.db"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_FAULT_")}
        self.env.pop("RUNYARD_DB_URL", None)
        self.env["RUNYARD_HOME"] = str(home)
        if tree is not None:  # runyard from another checkout (the code before a change), this interpreter
            self.env["PYTHONPATH"] = str(tree)
        self.scheduler: subprocess.Popen | None = None
        self._log = None
        # A checkout from before the phase marks (migration 0014) has no such column.
        self.tree_without_marks = tree is not None and not any(
            (tree / "db" / where / "phases.py").exists() for where in (".", "vocabulary"))

    # -- processes ----------------------------------------------------------------------

    def cli(self, *args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "orchestrator", *args], env=self.env, capture_output=True,
                                text=True, timeout=120)
        if result.returncode != 0:
            raise BenchError(f"runyard {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    def start(self, *overrides: str) -> int:
        self.cli("db", "upgrade")
        args = ["submit", str(EXAMPLE)]
        for item in (*OVERRIDES, *EXTRA, *overrides):
            args += ["--set", item]
        run_id = int(self.cli(*args).strip())
        self._log = open(self.home / "scheduler.log", "ab")  # noqa: SIM115 - the scheduler's log, open for its life
        self.scheduler = subprocess.Popen([sys.executable, "-m", "orchestrator", "scheduler"], env=self.env,
                                          stdout=self._log, stderr=subprocess.STDOUT)
        return run_id

    def _ours(self, proc: psutil.Process) -> bool:
        env = proc.environ()
        run_dir = env.get("RUNYARD_RUN_DIR", "")
        return run_dir == str(self.home) or run_dir.startswith(str(self.home) + os.sep)

    def training_processes(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == os.getpid():
                continue
            try:
                if self._ours(proc) and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        return found

    def rank_process(self, attempt: int, rank: int) -> psutil.Process | None:
        for proc in self.training_processes():
            try:
                env = proc.environ()
            except (psutil.Error, OSError):
                continue
            if env.get("LOCAL_RANK") == str(rank) and env.get("RUNYARD_ATTEMPT") == str(attempt):
                return proc
        return None

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """SIGSTOP every training process of this installation for the block (the floor is timed
        on the same cores with nothing of the run competing), SIGCONT after."""
        @contextlib.contextmanager
        def pause() -> Any:
            procs = self.training_processes()
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signal.SIGSTOP)
            try:
                yield
            finally:
                for proc in procs:
                    with contextlib.suppress(psutil.Error):
                        proc.send_signal(signal.SIGCONT)
        return pause()

    def close(self) -> None:
        """SIGTERM the scheduler, then SIGKILL whatever training processes are left."""
        if self.scheduler is not None and self.scheduler.poll() is None:
            self.scheduler.send_signal(signal.SIGTERM)
            try:
                self.scheduler.wait(15)
            except subprocess.TimeoutExpired:
                self.scheduler.kill()
                self.scheduler.wait(10)
        left = self.training_processes()
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(left, timeout=10)
        if self._log is not None:
            self._log.close()

    def scheduler_log_tail(self, chars: int = 3000) -> str:
        try:
            return (self.home / "scheduler.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- the database, read directly (fast) -----------------------------------------------

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            con = sqlite3.connect(self.db, timeout=10)
            try:
                return con.execute(sql, params).fetchall()
            finally:
                con.close()
        except sqlite3.OperationalError:  # locked for longer than the timeout: look again later
            return []

    def attempts(self, run_id: int) -> list[dict[str, Any]]:
        columns = ATTEMPT_COLUMNS if not self.tree_without_marks else (*ATTEMPT_COLUMNS[:-1], "NULL")
        rows = self._query(f"SELECT {', '.join(columns)} FROM attempts WHERE run_id = ? ORDER BY number",
                           (run_id,))
        return [dict(zip(ATTEMPT_COLUMNS, row, strict=True)) for row in rows]

    def run_status(self, run_id: int) -> tuple[str, str]:
        rows = self._query("SELECT status, status_reason FROM runs WHERE id = ?", (run_id,))
        return (rows[0][0], rows[0][1] or "") if rows else ("?", "")

    def step_times(self, run_id: int) -> list[tuple[int, int, float]]:
        return self._query("SELECT attempt, step, value FROM metrics WHERE run_id = ? AND key = 'step_time' "
                           "AND rank = 0 AND value IS NOT NULL", (run_id,))

    def wait(self, run_id: int, what: str, until, timeout: float) -> Any:
        """Poll the attempts until ``until(attempts)`` returns something truthy."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            attempts = self.attempts(run_id)
            found = until(attempts) if attempts else None
            if found:
                return found
            status, reason = self.run_status(run_id)
            if status not in ACTIVE:
                raise BenchError(f"run {run_id} ended {status} while waiting for {what}: {reason}")
            if self.scheduler is not None and self.scheduler.poll() is not None:
                raise BenchError(f"the scheduler exited {self.scheduler.returncode} while waiting for {what}:\n"
                                 + self.scheduler_log_tail())
            time.sleep(POLL_S)
        raise BenchError(f"run {run_id}: no {what} within {timeout:.0f} s; attempts: {self.attempts(run_id)}")

    def wait_training(self, run_id: int, min_steps: int, timeout: float = 300.0) -> dict[str, Any]:
        """The newest attempt, once it has completed ``min_steps`` steps past its first step."""
        def ready(attempts: list[dict[str, Any]]) -> dict[str, Any] | None:
            a = attempts[-1]
            if a["status"] != "RUNNING" or a["first_step_at"] is None or a["last_step"] is None:
                return None
            first_step = (a["resume_step"] or 0) + 1
            return a if a["last_step"] - first_step >= min_steps else None

        return self.wait(run_id, f"{min_steps} steps of the newest attempt", ready, timeout)

    def kill_rank(self, run_id: int, attempt: int, rank: int, timeout: float = 30.0) -> float:
        """SIGKILL ``rank`` of ``attempt``; returns the wall time just before the signal."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.rank_process(attempt, rank)
            if proc is not None:
                try:
                    kill_time = time.time()
                    proc.send_signal(signal.SIGKILL)
                    return kill_time
                except psutil.NoSuchProcess:
                    pass
            time.sleep(POLL_S)
        raise BenchError(f"run {run_id}: rank {rank} of attempt {attempt} is not running")


def nproc_of(product: Product, run_id: int) -> int:
    rows = product._query("SELECT nproc FROM runs WHERE id = ?", (run_id,))
    return int(rows[0][0]) if rows else 2


# -- part 1: recovery time ------------------------------------------------------------------


def recovery(product: Product, injections: int, min_steps: int, rand: random.Random) -> list[dict[str, Any]]:
    run_id = product.start("name=bench-recovery")
    nproc = nproc_of(product, run_id)
    results = []
    for i in range(1, injections + 1):
        extra = rand.randint(0, 19)
        current = product.wait_training(run_id, min_steps + extra)
        number = current["number"]
        victim = rand.randrange(nproc)
        kill_time = product.kill_rank(run_id, number, victim)

        def recovered(attempts: list[dict[str, Any]], number: int = number) -> tuple[dict, dict] | None:
            if len(attempts) <= number:
                return None
            failed, nxt = attempts[number - 1], attempts[number]
            return (failed, nxt) if nxt["first_step_at"] is not None and failed["detected_at"] is not None else None

        failed, nxt = product.wait(run_id, f"the first step after kill {i}", recovered, timeout=300)
        r = {
            "attempt": number,
            "rank": victim,
            "killed_after_step": failed["last_step"],
            "resume_step": nxt["resume_step"],
            "cause": failed["cause"],
            "failed_rank": failed["failed_rank"],
            "exit": failed["failed_at"] - kill_time if failed["failed_at"] is not None else None,
            "detect": failed["detected_at"] - kill_time,
            "relaunch": nxt["started_at"] - failed["detected_at"],
            "resume": nxt["first_step_at"] - nxt["started_at"],
            "total": nxt["first_step_at"] - kill_time,
        }
        nxt["phase_marks"], failed["phase_marks"] = marks_from_json(nxt["phase_marks_json"]), {}
        r["phases"] = {p["phase"]: p["seconds"] for p in attempt_phases(nxt, failed) or []}
        r["startup"] = nxt["first_step_at"] - nxt["started_at"]  # launch -> first step, as a fresh start's
        if number == 1:  # the run's fresh start, for the resumed start-ups to be compared with
            failed["phase_marks"] = marks_from_json(failed["phase_marks_json"])
            r["fresh_startup"] = failed["first_step_at"] - failed["started_at"]
            r["fresh_phases"] = {p["phase"]: p["seconds"] for p in attempt_phases(failed, None) or []}
            print("  the fresh attempt's start-up: " + "  ".join(f"{k} {v:.2f}" for k, v in r["fresh_phases"].items())
                  + f" = {r['fresh_startup']:.2f} s", flush=True)
        # The floor, side by side: a bare torchrun start of the same ranks, with the run stopped.
        product.wait_training(run_id, 5)
        with product.paused():
            r["floor"] = floor_start(nproc)
        r["ratio"] = r["total"] / r["floor"]
        results.append(r)
        odd = "" if r["cause"] == "SIGNAL" and r["failed_rank"] == victim else "  (!) cause/rank differ from the kill"
        exit_s = f"{r['exit']:.2f}" if r["exit"] is not None else "n/a"
        print(f"injection {i}: attempt {number} rank {victim} after step {r['killed_after_step']} -> "
              f"{r['cause']} rank {r['failed_rank']}, resumed from step {r['resume_step']}: "
              f"detect {r['detect']:.2f} s (exit {exit_s}), relaunch {r['relaunch']:.2f} s, "
              f"resume {r['resume']:.2f} s, total {r['total']:.2f} s; floor {r['floor']:.2f} s, "
              f"ratio {r['ratio']:.2f}{odd}", flush=True)
        print("  phases: " + "  ".join(f"{k} {v:.2f}" for k, v in r["phases"].items()), flush=True)
    return results


def summarize_recovery(results: list[dict[str, Any]]) -> dict[str, Any]:
    medians = {k: statistics.median(r[k] for r in results) for k in (*COMPONENTS, "floor", "ratio")}
    phase_names = list(dict.fromkeys(k for r in results for k in r["phases"]))
    phase_medians = {k: statistics.median(r["phases"].get(k, 0.0) for r in results) for k in phase_names}
    print("median phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in phase_medians.items()))
    floor_ratio = medians["total"] / medians["floor"]
    fresh = [r["fresh_startup"] for r in results if "fresh_startup" in r]
    if fresh:
        print(f"start-up (launch -> first step): fresh {fresh[0]:.2f} s (one), resumed median "
              f"{statistics.median(r['startup'] for r in results):.2f} s")
    print(f"kill -> first new step median {medians['total']:.2f} s, bare torchrun start median "
          f"{medians['floor']:.2f} s:"
          f" {floor_ratio:.2f}x (median of the per-kill ratios {medians['ratio']:.2f}x); target <= "
          f"{TARGET_FLOOR_RATIO}x: {'PASS' if floor_ratio <= TARGET_FLOOR_RATIO else 'MISS'}; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    p95s = {k: p95([r[k] for r in results]) for k in COMPONENTS}
    print("median: " + ", ".join(f"{k} {v:.2f} s" for k, v in medians.items()))
    print("p95:    " + ", ".join(f"{k} {v:.2f} s" for k, v in p95s.items()) + f"  (nearest rank of {len(results)})")
    ok = medians["total"] <= TARGET_MEDIAN_S and p95s["total"] <= TARGET_P95_S
    print(f"target total median <= {TARGET_MEDIAN_S:.0f} s and p95 <= {TARGET_P95_S:.0f} s: "
          f"{'PASS' if ok else 'MISS'} (median {medians['total']:.2f} s, p95 {p95s['total']:.2f} s)", flush=True)
    return {"injections": len(results), "median_s": medians, "p95_s": p95s, "target_met": ok,
            "phase_median_s": phase_medians, "floor_ratio": floor_ratio, "per_injection": results}


# -- part 2: goodput under failures -----------------------------------------------------------


def own_goodput(product: Product, run_id: int, now: float) -> dict[str, Any]:
    """(lineage steps x mean rank-0 step_time on the lineage) / (now - first attempt's start)."""
    attempts = product.attempts(run_id)
    cutoff: dict[int, float] = {}
    later_min = math.inf
    for a in reversed(attempts):  # what an attempt did past the step a later one resumed from is lost
        cutoff[a["number"]] = later_min
        later_min = min(later_min, a["resume_step"] or 0)
    times = [v for att, step, v in product.step_times(run_id) if step <= cutoff.get(att, math.inf)]
    last = attempts[-1]
    steps = last["last_step"] if last["last_step"] is not None else (last["resume_step"] or 0)
    wall = now - attempts[0]["started_at"]
    mean = statistics.fmean(times) if times else float("nan")
    return {"goodput": steps * mean / wall if times and wall > 0 else None, "lineage_steps": steps,
            "mean_step_time_s": mean, "step_time_rows": len(times), "wall_s": wall, "attempts": len(attempts)}


def goodput(product: Product, minutes: float, kill_every: float, rand: random.Random) -> dict[str, Any]:
    run_id = product.start("name=bench-goodput")
    nproc = nproc_of(product, run_id)
    first = product.wait(run_id, "the first attempt", lambda attempts: attempts[0], timeout=120)
    t0 = first["started_at"]
    end = t0 + minutes * 60
    every = f"a rank SIGKILLed every {kill_every:g} s" if kill_every > 0 else "no kills"
    print(f"goodput run {run_id}: {minutes:g} min from the first launch, {every}", flush=True)
    kills = []
    next_kill = t0 + kill_every if kill_every > 0 else math.inf  # --kill-every 0: a baseline without kills
    while next_kill < end:
        time.sleep(max(0.0, next_kill - time.time()))
        # A kill before the attempt's first step would test startup, not recovery: wait for one.
        current = product.wait_training(run_id, 0)
        victim = rand.randrange(nproc)
        kill_time = product.kill_rank(run_id, current["number"], victim)
        kills.append({"at_s": kill_time - t0, "attempt": current["number"], "rank": victim,
                      "after_step": current["last_step"]})
        print(f"  t+{kill_time - t0:.1f} s: SIGKILL rank {victim} of attempt {current['number']} "
              f"(around step {current['last_step']})", flush=True)
        next_kill += kill_every
    time.sleep(max(0.0, end - time.time()))
    detail = json.loads(product.cli("show", str(run_id), "--json"))
    ours = own_goodput(product, run_id, time.time())
    reported = detail["goodput"]
    attempts = detail["attempts"]
    recoveries = [a["recovery_s"] for a in attempts if a.get("recovery_s") is not None]
    print(f"after {ours['wall_s']:.1f} s: {ours['attempts']} attempts, {len(kills)} kills, lineage step "
          f"{ours['lineage_steps']}, mean rank-0 step_time {ours['mean_step_time_s'] * 1000:.2f} ms "
          f"({ours['step_time_rows']} rows)")
    if recoveries:
        print("runyard recovery_s (failed_at -> next first step): " + ", ".join(f"{x:.2f}" for x in recoveries))
    fmt = lambda x: f"{x:.3f}" if x is not None else "n/a"  # noqa: E731
    print(f"goodput: runyard show {fmt(reported)}, computed here {fmt(ours['goodput'])}", flush=True)
    product.cli("cancel", str(run_id))
    deadline = time.monotonic() + 120
    while (status := product.run_status(run_id)[0]) != "CANCELLED":
        if status not in ACTIVE or time.monotonic() > deadline:
            raise BenchError(f"run {run_id} is {status} after cancel, not CANCELLED")
        time.sleep(0.2)
    print(f"run {run_id} CANCELLED", flush=True)
    return {"minutes": minutes, "kill_every_s": kill_every, "kills": kills, "runyard_goodput": reported,
            "own_goodput": ours["goodput"], "own": ours, "recovery_s": recoveries}


# -- main -------------------------------------------------------------------------------------


def in_fresh_home(part, *args: Any, tree: Path | None = None) -> Any:
    with tempfile.TemporaryDirectory(prefix="runyard-bench-", ignore_cleanup_errors=True) as tmp:
        product = Product(Path(tmp), tree)
        try:
            return part(product, *args)
        except BenchError:
            tail = product.scheduler_log_tail()
            if tail:
                print(f"--- scheduler log (tail) ---\n{tail}", file=sys.stderr)
            raise
        finally:
            product.close()


def print_rows(summary: dict[str, Any], load_at_start: float) -> None:
    """The BENCHMARKS.md row of each part that ran."""
    if "recovery" in summary:
        r = summary["recovery"]
        median, p95s, ratio = r["median_s"], r["p95_s"], r["floor_ratio"]
        print_row("Recovery after a killed rank", "a rank SIGKILLed to the next attempt's first step, beside a bare "
                  "torchrun start (the floor)",
                  f"{median['total']:.2f} s against the floor's {median['floor']:.2f} s: **{ratio:.2f}x** (target <= "
                  f"{TARGET_FLOOR_RATIO}x: {verdict(ratio <= TARGET_FLOOR_RATIO)}); p95 {p95s['total']:.2f} s "
                  f"(target median <= {TARGET_MEDIAN_S:.0f} s, p95 <= {TARGET_P95_S:.0f} s: "
                  f"{verdict(r['target_met'])}); medians of {r['injections']} kills", load_at_start)
    if "goodput" in summary:
        g = summary["goodput"]
        def shown(x: float | None) -> str:
            return f"{x:.3f}" if x is not None else "n/a"

        kills = f"a rank SIGKILLed every {g['kill_every_s']:g} s" if g["kill_every_s"] > 0 else "no kills"
        print_row("Goodput under failures", "the share of a run's wall time in training steps while its ranks "
                  "are SIGKILLed", f"**{shown(g['runyard_goodput'])}** (`runyard show`; counted here "
                  f"{shown(g['own_goodput'])}) over {g['minutes']:g} min, {kills}", load_at_start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--injections", type=int, default=10, help="kills in part 1 (0 skips it)")
    parser.add_argument("--goodput-minutes", type=float, default=3.0, help="length of part 2 (0 skips it)")
    parser.add_argument("--kill-every", type=float, default=60.0,
                        help="seconds between kills in part 2 (0: no kills, a baseline)")
    parser.add_argument("--min-steps", type=int, default=30, help="steps past the first step before a kill")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tree", type=Path, help="time runyard from this checkout instead (the code before a change: "
                        "git archive COMMIT | tar -x -C DIR); its scheduler and ranks import DIR")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for the runs (repeatable): launch.warm_start=false")
    args = parser.parse_args()
    load_at_start = load_average()
    EXTRA.extend(args.set)
    signal.signal(signal.SIGTERM, _interrupt)
    rand = random.Random(args.seed)
    summary: dict[str, Any] = {"seed": args.seed}
    try:
        if args.injections > 0:
            print(f"== recovery time: {args.injections} SIGKILLs of one rank, each beside a bare torchrun start; "
                  f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} ==", flush=True)
            results = in_fresh_home(recovery, args.injections, args.min_steps, rand, tree=args.tree)
            summary["recovery"] = summarize_recovery(results)
        if args.goodput_minutes > 0:
            print(f"== goodput under a SIGKILL every {args.kill_every:g} s ==" if args.kill_every > 0
                  else "== goodput without kills (baseline) ==", flush=True)
            summary["goodput"] = in_fresh_home(goodput, args.goodput_minutes, args.kill_every, rand, tree=args.tree)
    except KeyboardInterrupt:
        print("interrupted; every process started here was stopped", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    print_rows(summary, load_at_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
