"""Tokens/s and MFU of a ~124M-parameter GPT in bf16 with torch.compile on one GPU, under runyard
and in a hand-written loop of the same model and data, side by side.

    python bench/bench_gpu.py [--reps 2] [--steps 300] [--warmup 100] [--shape 124m]

Needs a CUDA GPU (it exits with a message without one).

runyard side: the product end to end, as bench_overhead.py runs it: a real `runyard scheduler`,
`runyard submit` of a gpt-char run with 1 rank (torchrun, NCCL), bf16 autocast,
``compile = true``, fused AdamW, a cosine schedule, clipping at 1.0, metrics every step
(``log_every = 1``) and async verified checkpoints every 100 steps. Its tokens/s comes from the
wall times of rank 0's metric rows between step ``warmup`` and the last step (compilation is
left out); its MFU is the median of the ``mfu`` metric the dashboard shows after ``warmup``.

Hand-written side: this file with ``--hand-loop``, the loop of nanoGPT's train.py on one GPU:
the same GPT class and batches (pinned, copied without blocking), ``torch.compile(model)``,
bf16 autocast, fused AdamW, the same schedule and clipping, ``loss.item()`` every 10 steps, no
checkpoint. Its window starts and ends with a device synchronisation (the CPU runs steps ahead
of the GPU between its ``loss.item()`` calls).

MFU = tokens/s x FLOPs per token / the GPU's bf16 dense peak (trainer.techniques.GPU_PEAK_FLOPS);
FLOPs per token = 6 N + 12 n_layer n_embd block_size (PaLM appendix B, as nanoGPT counts).
Ends with its BENCHMARKS.md row (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_overhead import bench_env, managed_run  # noqa: E402
from bench.benchmarks_row import load_average, print_row, verdict  # noqa: E402 - needs ROOT on sys.path
from trainer.techniques import gpu_peak_flops  # noqa: E402 - needs ROOT on sys.path
from trainer.workloads.gpt_char import GPT, flops_per_token, get_batch, load_corpus, window_generator  # noqa: E402 - needs ROOT on sys.path

# ~124M parameters with a character vocabulary: 10 blocks of width 1024 (head size 64) hold
# 125.8M; GPT-2 small's own shape (12 x 768) holds 85M here, its other 39M being the 50k-token
# embedding that a character model does not have.
SHAPES = {
    "124m": {"n_layer": 10, "n_head": 16, "n_embd": 1024, "block_size": 1024},
    "gpt2-small-blocks": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024},
}
BATCH = 64
LR = 6e-4
CLIP = 1.0
HAND_LOG_EVERY = 10


def runyard_side(shape: dict[str, int], steps: int, warmup: int, batch: int, log_every: int,
                 ckpt_every: int) -> dict[str, Any]:
    sets = [f"workload.{k}={v}" for k, v in shape.items()] + [
        "workload.kind=gpt-char", "name=bench-gpu", "launch.nproc_per_node=1", f"train.batch_size={batch}",
        f"train.lr={LR}", f"train.max_steps={steps}", f"train.log_every={log_every}", "train.eval_every=0",
        f"train.clip_grad_norm={CLIP}", "train.lr_schedule=cosine", "train.precision=bf16", "train.compile=true",
        f"checkpoint.every_steps={ckpt_every}", "supervision.startup_timeout_s=900",
    ]
    got = managed_run(sets, steps, warmup, keys=("mfu", "tokens_per_s", "mem_peak_mib"), series="step_time")
    got["tokens_per_s_wall"] = got.pop("steps_per_s") * batch * shape["block_size"]
    # Where the wall time went: the logged intervals much slower than the median.
    times = [(step, t) for step, t in got.pop("series") if step > warmup]
    typical = statistics.median(t for _, t in times)
    got["slow_intervals"] = [(step, round(t * 1e3, 1)) for step, t in times if t > 1.5 * typical]
    got["step_time_ms"] = typical * 1e3
    return got


def hand_side(shape_name: str, steps: int, warmup: int, batch: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="runyard-bench-gpu-") as tmp:
        out = Path(tmp) / "result.json"
        done = subprocess.run(
            [sys.executable, __file__, "--hand-loop", "--shape", shape_name, "--steps", str(steps),
             "--warmup", str(warmup), "--batch", str(batch), "--out", str(out)],
            env=bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the hand-written loop failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def hand_loop(shape: dict[str, int], steps: int, warmup: int, batch: int, out: Path) -> None:
    """nanoGPT's loop on one GPU; writes tokens/s and MFU between step ``warmup`` and the end."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    corpus = load_corpus(None)
    model = GPT(len(corpus.vocab), shape["n_layer"], shape["n_head"], shape["n_embd"], shape["block_size"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)
    compiled = torch.compile(model)
    t = shape["block_size"]
    times = []
    for step in range(steps):
        lr = 0.5 * (1.0 + math.cos(math.pi * step / steps)) * LR
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(corpus.train, t, batch, window_generator(0, "train", step, 0))
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = compiled(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % HAND_LOG_EVERY == 0:
            print(f"iter {step}: loss {loss.item():.4f}", flush=True)
        if step in (warmup - 1, steps - 1):  # the window's ends: when the GPU, not the CPU, got there
            torch.cuda.synchronize()
        times.append(time.perf_counter())
    tokens_per_s = (steps - warmup) * batch * t / (times[-1] - times[warmup - 1])
    peak = gpu_peak_flops(device)
    mfu = tokens_per_s * flops_per_token(model, shape["n_layer"], shape["n_embd"], t) / peak if peak else math.nan
    out.write_text(json.dumps({"tokens_per_s": tokens_per_s, "mfu": mfu, "loss": loss.item(),
                               "mem_peak_mib": torch.cuda.max_memory_allocated() / 2**20}))


def gpu_result(summary: dict[str, Any]) -> str:
    """The BENCHMARKS.md row's result: each side's medians, MFU against the 45% target, the ratio."""
    parts = []
    if "runyard_mfu" in summary:
        mfu = summary["runyard_mfu"]
        parts.append(f"runyard {summary['runyard_tokens_per_s']:,.0f} tokens/s, MFU **{mfu:.1%}** (target >= 45%: "
                     f"{verdict(mfu >= 0.45)})")
    if "hand_mfu" in summary:
        parts.append(f"hand-written {summary['hand_tokens_per_s']:,.0f} tokens/s, MFU {summary['hand_mfu']:.1%}")
    if len(parts) == 2:
        parts.append(f"runyard / hand **{summary['runyard_tokens_per_s'] / summary['hand_tokens_per_s']:.3f}**")
    peak = max((r["mem_peak_mib"] for side in ("hand", "runyard") for r in summary.get(side, [])), default=0.0)
    return "; ".join([*parts, f"{summary['device']}, peak memory {peak / 1024:.1f} GiB"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100, help="steps left out at the start (compilation)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="124m")
    parser.add_argument("--batch", type=int, default=BATCH, help="sequences per step")
    parser.add_argument("--log-every", type=int, default=1, help="runyard's train.log_every")
    parser.add_argument("--ckpt-every", type=int, default=100, help="runyard's checkpoint.every_steps (0: none)")
    parser.add_argument("--sides", default="hand,runyard", help="which sides to run, in this order")
    parser.add_argument("--hand-loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    if args.hand_loop:
        hand_loop(shape, args.steps, args.warmup, args.batch, args.out)
        return

    if not torch.cuda.is_available():
        sys.exit("bench_gpu needs a CUDA GPU; none is visible to torch here")
    load_at_start = load_average()
    n_params = sum(p.numel() for p in GPT(128, **shape).parameters())
    sides = args.sides.split(",")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; GPT {args.shape} {shape}: "
          f"{n_params / 1e6:.1f}M parameters, batch {args.batch} x {shape['block_size']} tokens, bf16, compile; "
          f"runyard: log_every {args.log_every}, checkpoint every {args.ckpt_every} steps; "
          f"{args.steps} steps timed from {args.warmup}; {args.reps} alternating repetitions", flush=True)
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for i in range(args.reps):
        for side in sides:
            if side == "hand":
                results[side].append(hand_side(args.shape, args.steps, args.warmup, args.batch))
                h = results[side][-1]
                print(f"rep {i + 1} hand: {h['tokens_per_s']:,.0f} tokens/s, MFU {h['mfu']:.1%}, peak memory "
                      f"{h['mem_peak_mib'] / 1024:.1f} GiB", flush=True)
            else:
                results[side].append(runyard_side(shape, args.steps, args.warmup, args.batch, args.log_every,
                                                  args.ckpt_every))
                r = results[side][-1]
                print(f"rep {i + 1} runyard: {r['tokens_per_s_wall']:,.0f} tokens/s (wall), MFU "
                      f"{r['tokens_per_s_wall'] / r['tokens_per_s'] * r['mfu']:.1%} (wall), {r['mfu']:.1%} (its "
                      f"metric, median step {r['step_time_ms']:.1f} ms), "
                      f"peak memory {r['mem_peak_mib'] / 1024:.1f} GiB; slow intervals (step, ms): "
                      f"{r['slow_intervals']}", flush=True)
    summary: dict[str, Any] = {"device": torch.cuda.get_device_name(), "shape": shape, "batch": args.batch,
                               "log_every": args.log_every, "ckpt_every": args.ckpt_every, **results}
    if "hand" in results:
        summary["hand_tokens_per_s"] = statistics.median(h["tokens_per_s"] for h in results["hand"])
        summary["hand_mfu"] = statistics.median(h["mfu"] for h in results["hand"])
    if "runyard" in results:
        runs = results["runyard"]
        summary["runyard_tokens_per_s"] = statistics.median(r["tokens_per_s_wall"] for r in runs)
        summary["runyard_mfu"] = statistics.median(r["tokens_per_s_wall"] / r["tokens_per_s"] * r["mfu"] for r in runs)
    line = []
    for side in ("hand", "runyard"):
        if f"{side}_mfu" in summary:
            line.append(f"{side} {summary[f'{side}_tokens_per_s']:,.0f} tokens/s, MFU {summary[f'{side}_mfu']:.1%}")
    if len(line) == 2:
        line.append(f"runyard / hand {summary['runyard_tokens_per_s'] / summary['hand_tokens_per_s']:.3f}")
    print("medians (wall time, checkpoints included): " + "; ".join(line) + " (target: MFU >= 45% on an H100)")
    print(json.dumps(summary))
    print_row("GPU throughput and MFU", "tokens/s and MFU of a 127M GPT, bf16 and compile, on one GPU: runyard end "
              "to end against nanoGPT's loop",
              gpu_result(summary), load_at_start)


if __name__ == "__main__":
    main()
