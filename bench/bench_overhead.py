"""Steps/s of gpt-char under runyard against a hand-written DDP loop of the same model and data.

    .venv/bin/python bench/bench_overhead.py [--reps 7] [--steps 300] [--warmup 50]

runyard side: a fresh data folder, a real `runyard scheduler`, `runyard submit` of a 2-rank
gpt-char run with metrics every step (log_every = 1) and checkpoints on (every 50 steps, async).
Its steps/s comes from the wall times of rank 0's metric rows, between step ``warmup`` and the
last step (start-up and the final evaluation are left out).

Hand-written side: this file run under torchrun with ``--hand-loop``: the plain nanoGPT-style
DDP loop (same GPT class, same batches, same AdamW), no metrics, no checkpoints; rank 0 times
the same steps with ``time.time()``.

The two alternate, ``reps`` times each; printed: each pair's ratio, the ratio of the medians
(target >= 0.98), the median of the pairs' ratios (less sensitive to the machine drifting
between repetitions), and the scheduler process's CPU share while a run trains.
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

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # under torchrun the script's folder, not the root, is on the path

MODEL = {"n_layer": 2, "n_head": 4, "n_embd": 128, "block_size": 64}
BATCH = 16
LR = 1e-3
SCHEDULER_CPU: list[float] = []  # scheduler process CPU seconds per wall second, one per managed run


def bench_env(home: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RUNYARD_DB_URL", None)
    env.pop("OMP_NUM_THREADS", None)  # both sides get torchrun's default
    if home is not None:
        env["RUNYARD_HOME"] = str(home)
    return env


def runyard_steps_per_s(steps: int, warmup: int) -> float:
    """One managed run; steps/s between step ``warmup`` and ``steps`` from the metric rows."""
    with tempfile.TemporaryDirectory(prefix="runyard-bench-") as tmp:
        home = Path(tmp)
        env = bench_env(home)
        runyard = [sys.executable, "-m", "orchestrator"]
        subprocess.run([*runyard, "db", "upgrade"], env=env, check=True, capture_output=True)
        sched = subprocess.Popen([*runyard, "scheduler"], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            sets = [f"workload.{k}={v}" for k, v in MODEL.items()] + [
                "workload.kind=gpt-char", "name=bench-overhead", f"train.batch_size={BATCH}", f"train.lr={LR}",
                f"train.max_steps={steps}", "train.log_every=1", "train.eval_every=0",
                "checkpoint.every_steps=50", "supervision.startup_timeout_s=600",
            ]
            args = [*runyard, "submit", str(ROOT / "examples" / "digits.toml")]
            for item in sets:
                args += ["--set", item]
            run_id = int(subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout.strip())
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
            con.close()
            return (steps - warmup) / (rows[steps] - rows[warmup])
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


def hand_steps_per_s(steps: int, warmup: int) -> float:
    """One torchrun launch of the hand-written loop (this file with --hand-loop)."""
    with tempfile.TemporaryDirectory(prefix="runyard-bench-hand-") as tmp:
        out = Path(tmp) / "times.json"
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             __file__, "--hand-loop", "--steps", str(steps), "--out", str(out)],
            env=bench_env(), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        times = json.loads(out.read_text())  # times[i]: wall time when step i + 1 finished
        return (steps - warmup) / (times[steps - 1] - times[warmup - 1])


def hand_loop(steps: int, out: Path) -> None:
    """The plain DDP loop: what a person writes by hand, nanoGPT style."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainer.workloads.gpt_char import GPT, get_batch, load_corpus, window_generator

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    corpus = load_corpus(None)
    model = GPT(len(corpus.vocab), MODEL["n_layer"], MODEL["n_head"], MODEL["n_embd"], MODEL["block_size"])
    ddp = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, foreach=True)
    times = []
    for step in range(steps):
        x, y = get_batch(corpus.train, MODEL["block_size"], BATCH, window_generator(0, "train", step, rank))
        logits = ddp(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.time())
    if rank == 0:
        out.write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50, help="steps left out at the start")
    parser.add_argument("--hand-loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hand_loop:
        hand_loop(args.steps, args.out)
        return
    print(f"gpt-char {MODEL}, batch {BATCH} per rank, 2 ranks on CPU, {args.steps} steps "
          f"(timed from step {args.warmup}), {args.reps} alternating repetitions", flush=True)
    runyard, hand = [], []
    for i in range(args.reps):
        hand.append(hand_steps_per_s(args.steps, args.warmup))
        runyard.append(runyard_steps_per_s(args.steps, args.warmup))
        print(f"rep {i + 1}: hand-written {hand[-1]:.2f} steps/s, runyard {runyard[-1]:.2f} steps/s, "
              f"ratio {runyard[-1] / hand[-1]:.3f}", flush=True)
    med_hand, med_runyard = statistics.median(hand), statistics.median(runyard)
    ratio = med_runyard / med_hand
    pair_ratio = statistics.median(r / h for r, h in zip(runyard, hand))
    print(f"scheduler process (supervision, system metrics): {statistics.median(SCHEDULER_CPU) * 100:.1f}% "
          "of one core while a run trains (median)")
    print(f"median: hand-written {med_hand:.2f} steps/s, runyard {med_runyard:.2f} steps/s, "
          f"ratio {ratio:.3f} (target >= 0.98); median of the pairs' ratios {pair_ratio:.3f}")
    print(json.dumps({"reps": args.reps, "steps": args.steps, "hand_steps_per_s": hand,
                      "runyard_steps_per_s": runyard, "ratio_of_medians": ratio,
                      "median_pair_ratio": pair_ratio,
                      "scheduler_cpu_fraction": SCHEDULER_CPU}))


if __name__ == "__main__":
    main()
