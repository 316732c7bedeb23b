"""Steps/s of gpt-char under runyard against hand-written DDP loops of the same model and data.

    .venv/bin/python bench/bench_overhead.py [--reps 7] [--steps 300] [--warmup 50] [--baseline DIR]

runyard side: a fresh data folder, a real `runyard scheduler`, `runyard submit` of a 2-rank
gpt-char run with metrics every step (log_every = 1), gradient clipping at 1.0 and checkpoints
on (every 50 steps, async, verified). Its steps/s comes from the wall times of rank 0's metric
rows, between step ``warmup`` and the last step (start-up and the final evaluation are left out).

Hand-written sides: this file run under torchrun with ``--hand-loop``; rank 0 times the same
steps with ``time.time()``.
- ``nanogpt``: the loop of nanoGPT's train.py, what a person would write: the same GPT class,
  batches and AdamW, a cosine learning-rate schedule, gradient clipping at 1.0, the loss printed
  every 10 steps (``loss.item()``), and a ``torch.save`` of model and optimizer on rank 0 every
  50 steps (synchronous, as nanoGPT does). The same work runyard is asked to do.
- ``bare``: forward, backward, step; nothing else. No loop anyone runs looks like this; it is
  the floor.

``--baseline DIR`` adds a fourth side: runyard from another checkout (``git worktree add DIR
COMMIT``, or ``git archive COMMIT | tar -x -C DIR``), its scheduler and ranks importing DIR
(on ``PYTHONPATH``) with this interpreter: a change against the code before it, under the same
load. The sides take turns, ``reps`` times each, then more repetitions (up to ``--max-reps``)
until the 95% interval of the mean per-repetition ratio runyard / nanogpt is within +-2%
(``--resolve``), or it says it cannot resolve that (the machine too noisy); printed: each
repetition's numbers, the ratios of the medians to each hand-written loop (target >= 0.98
against ``nanogpt``), the medians of the per-repetition ratios (less sensitive to the machine
drifting between repetitions), and the scheduler process's CPU share while a run trains; last,
its BENCHMARKS.md row (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # under torchrun the script's folder, not the root, is on the path
from bench.benchmarks_row import load_average, print_row, verdict  # noqa: E402 - needs ROOT on sys.path

MODEL = {"n_layer": 2, "n_head": 4, "n_embd": 128, "block_size": 64}
BATCH = 16
LR = 1e-3
CLIP = 1.0
SAVE_EVERY = 50
HAND_LOG_EVERY = 10
# Student's t at 97.5% by degrees of freedom (1-30); 1.96 beyond.
T975 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13, 2.12, 2.11, 2.10,
        2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04)
SCHEDULER_CPU: list[float] = []  # scheduler process CPU seconds per wall second, one per managed run


def bench_env(home: Path | None = None, tree: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RUNYARD_DB_URL", None)
    env.pop("OMP_NUM_THREADS", None)  # both sides get torchrun's default
    if home is not None:
        env["RUNYARD_HOME"] = str(home)
    if tree is not None:  # its packages come before this checkout's editable install
        env["PYTHONPATH"] = str(tree)
    return env


def runyard_steps_per_s(steps: int, warmup: int, tree: Path | None = None) -> float:
    """One managed 2-rank run on CPU; steps/s between step ``warmup`` and ``steps``."""
    sets = [f"workload.{k}={v}" for k, v in MODEL.items()] + [
        "workload.kind=gpt-char", "name=bench-overhead", f"train.batch_size={BATCH}", f"train.lr={LR}",
        f"train.max_steps={steps}", "train.log_every=1", "train.eval_every=0", f"train.clip_grad_norm={CLIP}",
        "train.lr_schedule=cosine", f"checkpoint.every_steps={SAVE_EVERY}", "supervision.startup_timeout_s=600",
    ]
    return managed_run(sets, steps, warmup, tree=tree)["steps_per_s"]


def managed_run(sets: list[str], steps: int, warmup: int, keys: tuple[str, ...] = (),
                series: str | None = None, tree: Path | None = None) -> dict[str, Any]:
    """One run through the product: a fresh data folder, a real `runyard scheduler`, `runyard
    submit` of examples/digits.toml with ``sets`` (``--set`` items) to ``steps`` steps.

    Returns:
        ``steps_per_s`` between step ``warmup`` and ``steps`` from the wall times of rank 0's
        metric rows (start-up, compilation and the final evaluation are left out), and for each
        of ``keys`` the median of rank 0's values of that metric after step ``warmup``; with
        ``series``, that metric's (step, value) pairs of rank 0 under ``"series"``. The
        scheduler's CPU share while the run trains is appended to SCHEDULER_CPU. With
        ``tree``, the scheduler and the ranks run that checkout's code (see ``--baseline``).
    """
    with tempfile.TemporaryDirectory(prefix="runyard-bench-") as tmp:
        home = Path(tmp)
        env = bench_env(home, tree)
        runyard = [sys.executable, "-m", "orchestrator"]
        subprocess.run([*runyard, "db", "upgrade"], env=env, check=True, capture_output=True, cwd=tree)
        sched = subprocess.Popen([*runyard, "scheduler"], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, cwd=tree)
        try:
            args = [*runyard, "submit", str(ROOT / "examples" / "digits.toml")]
            for item in sets:
                args += ["--set", item]
            run_id = int(subprocess.run(args, env=env, check=True, capture_output=True, text=True,
                                        cwd=tree).stdout.strip())
            ps = psutil.Process(sched.pid)
            wait_step(home, run_id, warmup)  # the scheduler's start-up and the launch are left out
            cpu0, t0 = sum(ps.cpu_times()[:2]), time.monotonic()
            wait_succeeded(home, run_id)
            SCHEDULER_CPU.append((sum(ps.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0))
            con = sqlite3.connect(home / "runyard.db")
            rows = dict(con.execute(
                "SELECT step, wall_time FROM metrics WHERE run_id = ? AND key = 'loss' AND rank = 0 AND step IN (?, ?)",
                (run_id, warmup, steps),
            ).fetchall())
            out = {"steps_per_s": (steps - warmup) / (rows[steps] - rows[warmup])}
            for key in keys:
                values = [v for (v,) in con.execute(
                    "SELECT value FROM metrics WHERE run_id = ? AND key = ? AND rank = 0 AND step > ?",
                    (run_id, key, warmup),
                )]
                out[key] = statistics.median(values) if values else float("nan")
            if series is not None:
                out["series"] = con.execute(
                    "SELECT step, value FROM metrics WHERE run_id = ? AND key = ? AND rank = 0 ORDER BY step",
                    (run_id, series),
                ).fetchall()
            con.close()
            return out
        finally:
            sched.send_signal(signal.SIGTERM)
            sched.wait(30)


def wait_step(home: Path, run_id: int, step: int, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        con = sqlite3.connect(home / "runyard.db")
        row = con.execute("SELECT max(last_step) FROM attempts WHERE run_id = ?", (run_id,)).fetchone()
        con.close()
        if row and row[0] is not None and row[0] >= step:
            return
        time.sleep(0.1)
    raise RuntimeError(f"run {run_id} did not reach step {step} in {timeout_s:.0f} s")


def wait_succeeded(home: Path, run_id: int, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        con = sqlite3.connect(home / "runyard.db")
        row = con.execute("SELECT status, status_reason FROM runs WHERE id = ?", (run_id,)).fetchone()
        con.close()
        if row and row[0] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            if row[0] != "SUCCEEDED":
                raise RuntimeError(f"run {run_id} ended {row[0]}: {row[1]}")
            return
        time.sleep(0.2)
    raise RuntimeError(f"run {run_id} did not finish in {timeout_s:.0f} s")


def hand_steps_per_s(steps: int, warmup: int, kind: str) -> float:
    """One torchrun launch of a hand-written loop (this file with --hand-loop KIND)."""
    for tries in range(1, 4):
        with tempfile.TemporaryDirectory(prefix="runyard-bench-hand-") as tmp:
            out = Path(tmp) / "times.json"
            done = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 __file__, "--hand-loop", kind, "--steps", str(steps), "--out", str(out)],
                env=bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            if done.returncode == 0:
                times = json.loads(out.read_text())  # times[i]: wall time when step i + 1 finished
                return (steps - warmup) / (times[steps - 1] - times[warmup - 1])
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        print(f"hand-written loop ({kind}) failed (try {tries}), exit {done.returncode}:\n{tail}", flush=True)
    raise RuntimeError(f"the hand-written loop ({kind}) failed three times")


def hand_loop(kind: str, steps: int, out: Path) -> None:
    """The hand-written DDP loop: nanoGPT's (``nanogpt``) or nothing but the step (``bare``)."""

    import torch  # noqa: PLC0415 - in the ranks: the measuring process stays without torch
    import torch.distributed as dist  # noqa: PLC0415 - in the ranks: the measuring process stays without torch
    import torch.nn.functional as F  # noqa: PLC0415 - in the ranks: the measuring process stays without torch
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: PLC0415 - in the ranks: the measuring process stays without torch

    from trainer.workloads.gpt_char import GPT, get_batch, load_corpus, window_generator  # noqa: PLC0415 - in the ranks: the measuring process stays without torch

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    corpus = load_corpus(None)
    model = GPT(len(corpus.vocab), MODEL["n_layer"], MODEL["n_head"], MODEL["n_embd"], MODEL["block_size"])
    ddp = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, foreach=True)
    nanogpt = kind == "nanogpt"
    times = []
    for step in range(steps):
        if nanogpt:  # nanoGPT's get_lr (no warm-up here, as runyard's run has none) and its checkpoint
            lr = 0.5 * (1.0 + math.cos(math.pi * step / steps)) * LR
            for group in optimizer.param_groups:
                group["lr"] = lr
            if step and step % SAVE_EVERY == 0 and rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": step},
                           out.with_name("ckpt.pt"))
        x, y = get_batch(corpus.train, MODEL["block_size"], BATCH, window_generator(0, "train", step, rank))
        logits = ddp(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        if nanogpt:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if nanogpt and step % HAND_LOG_EVERY == 0 and rank == 0:
            print(f"iter {step}: loss {loss.item():.4f}", flush=True)
        times.append(time.time())
    if rank == 0:
        out.write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def interval(pairs: list[float]) -> tuple[float, float]:
    """The mean of the per-repetition ratios and the half-width of its 95% t-interval."""
    mean = statistics.fmean(pairs)
    if len(pairs) < 2:
        return mean, float("inf")
    t = T975[len(pairs) - 2] if len(pairs) - 1 <= len(T975) else 1.96
    return mean, t * statistics.stdev(pairs) / len(pairs) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--max-reps", type=int, default=20, help="repeat up to this many times to resolve --resolve")
    parser.add_argument("--resolve", type=float, default=0.02,
                        help="the 95%% interval of runyard / nanogpt to reach (a fraction: 0.02 is +-2%%)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50, help="steps left out at the start")
    parser.add_argument("--baseline", type=Path, help="also time runyard from this checkout (the code before a change)")
    parser.add_argument("--hand-loop", choices=["nanogpt", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hand_loop:
        hand_loop(args.hand_loop, args.steps, args.out)
        return
    load_at_start = load_average()
    print(f"gpt-char {MODEL}, batch {BATCH} per rank, 2 ranks on CPU, {args.steps} steps "
          f"(timed from step {args.warmup}), {args.reps} alternating repetitions", flush=True)
    results: dict[str, list[float]] = {"nanogpt": [], "bare": [], "runyard": []}
    if args.baseline:
        results["baseline"] = []
    i = 0
    while True:
        if i >= args.reps:
            mean, half = interval([r / h for r, h in zip(results["runyard"], results["nanogpt"], strict=True)])
            if half <= args.resolve * mean or i >= args.max_reps:
                break
            print(f"after {i} repetitions runyard / nanogpt = {mean:.3f} +- {half / mean * 100:.1f}%: one more",
                  flush=True)
        i += 1
        for kind in ("nanogpt", "bare"):
            results[kind].append(hand_steps_per_s(args.steps, args.warmup, kind))
        if args.baseline:
            results["baseline"].append(runyard_steps_per_s(args.steps, args.warmup, args.baseline.resolve()))
        results["runyard"].append(runyard_steps_per_s(args.steps, args.warmup))
        print(f"rep {i}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in results.items()) + " steps/s; runyard / "
              f"nanogpt {results['runyard'][-1] / results['nanogpt'][-1]:.3f}, runyard / bare "
              f"{results['runyard'][-1] / results['bare'][-1]:.3f}", flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    summary: dict[str, object] = {"reps": i, "steps": args.steps, "steps_per_s": results}
    mean, half = interval([r / h for r, h in zip(results["runyard"], results["nanogpt"], strict=True)])
    resolved = half <= args.resolve * mean
    print(f"runyard / nanogpt: mean of the per-repetition ratios {mean:.3f} +- {half / mean * 100:.1f}% (95%, {i} "
          "repetitions): " + (f"resolves {args.resolve * 100:g}%" if resolved else
                              f"CANNOT resolve {args.resolve * 100:g}% on this machine now (load average "
                              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}); the ratio is only known to that"))
    summary["interval"] = {"mean": mean, "half_width": half, "resolved": resolved}
    print(f"scheduler process (supervision, system metrics): {statistics.median(SCHEDULER_CPU) * 100:.1f}% "
          "of one core while a run trains (median)")
    print("median steps/s: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
    for base in ("nanogpt", "bare", *(["baseline"] if args.baseline else [])):
        ratio = med["runyard"] / med[base]
        pairs = [r / h for r, h in zip(results["runyard"], results[base], strict=True)]
        target = " (target >= 0.98)" if base == "nanogpt" else ""
        print(f"runyard / {base}: ratio of medians {ratio:.3f}{target}; median of the per-repetition ratios "
              f"{statistics.median(pairs):.3f} (range {min(pairs):.2f}-{max(pairs):.2f})")
        summary[f"ratio_to_{base}"] = ratio
        summary[f"median_pair_ratio_to_{base}"] = statistics.median(pairs)
    if args.baseline:
        pairs = [b / h for b, h in zip(results["baseline"], results["nanogpt"], strict=True)]
        ratio = med["baseline"] / med["nanogpt"]
        print(f"baseline / nanogpt: ratio of medians {ratio:.3f}; median of the per-repetition ratios "
              f"{statistics.median(pairs):.3f} (range {min(pairs):.2f}-{max(pairs):.2f})")
        summary["baseline_ratio_to_nanogpt"] = ratio
    summary["scheduler_cpu_fraction"] = SCHEDULER_CPU
    print(json.dumps(summary))
    resolution = (f"resolves {args.resolve * 100:g}%" if resolved
                  else f"**cannot resolve {args.resolve * 100:g}%** here")
    print_row("Overhead on a training loop (CPU)", "steps/s of 2-rank gpt-char under runyard (metrics every step, "
              "checkpoints) against nanoGPT's DDP loop, taking turns",
              f"runyard / nanoGPT **{mean:.3f} +- {half / mean * 100:.1f}%** (95%, {i} repetitions): {resolution}; "
              f"ratio of medians {summary['ratio_to_nanogpt']:.3f} (target >= 0.98: "
              f"{verdict(summary['ratio_to_nanogpt'] >= 0.98)}); runyard / bare loop {summary['ratio_to_bare']:.3f}; "
              f"the scheduler {statistics.median(SCHEDULER_CPU) * 100:.1f}% of a core", load_at_start)


if __name__ == "__main__":
    main()
