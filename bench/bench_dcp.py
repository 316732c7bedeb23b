"""Benchmark: an FSDP checkpoint's memory per rank, save time, training stall and resume time.

Run from the repository root (4 gloo ranks on CPU, a ~113M-parameter gpt-char, AdamW)::

    .venv/bin/python bench/bench_dcp.py [--ranks 4] [--layers 16] [--embd 768] [--saves 3]

On a GPU workstation (NCCL, bf16 autocast, one GPU per rank)::

    .venv/bin/python bench/bench_dcp.py --gpu --ranks 1 --layers 24 --embd 1024

It launches torchrun twice. The first launch trains the workload through the SDK's ``Run``
exactly as ``python -m trainer`` does (``run.save_checkpoint(..., defer_snapshot=True)`` after
a step, ``run.before_update()`` before the next ``optimizer.step()``) and saves ``--saves``
times, one save every 3 steps; a thread in each rank samples its RSS every 2 ms. The second
launch resumes from the newest checkpoint on the same ranks and times ``run.load_checkpoint``.

Printed, per save (medians over the saves):

- peak RSS of each rank from the save call until the checkpoint is durable (its
  ``manifest.json`` exists), absolute and over the rank's RSS just before the save;
- save wall time: from the save call until the checkpoint is durable on disk;
- stall: the training loop's time inside ``save_checkpoint`` and ``before_update``, and
  the extra time of the save's step and the next two steps over a normal step;
- resume: the time of ``load_checkpoint`` (verification and load) in a fresh launch.

Only the SDK's public calls and the checkpoint folder's layout are used, so the same script
measures any checkpoint implementation behind them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SAVE_EVERY = 3
_PAGE = os.sysconf("SC_PAGE_SIZE")


class RssSampler:
    """Samples this process's resident set size every ``interval`` seconds; ``peak`` since ``reset``."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE

    def reset(self) -> int:
        self.peak = now = self.rss()
        return now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.rss())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def config(args: argparse.Namespace) -> Any:
    from db.config import apply_overrides, parse_config

    overrides = [
        "workload.kind=gpt-char", f"workload.n_layer={args.layers}", f"workload.n_head={args.heads}",
        f"workload.n_embd={args.embd}", "workload.block_size=64", "train.batch_size=2", "train.max_steps=1000",
        "parallel.strategy=fsdp", "checkpoint.every_steps=0", "checkpoint.keep_last=0", "train.lr_schedule=constant",
        "train.warmup_steps=0", f"train.precision={'bf16' if args.gpu else 'fp32'}",
    ]
    return parse_config(apply_overrides({"name": "bench-dcp"}, overrides))


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from trainer import distributed, techniques
    from trainer.context import RunContext
    from trainer.sdk import Run
    from trainer.workloads.gpt_char import GPTChar

    run_config = config(args)
    distributed.setup("nccl" if args.gpu else "gloo")
    work = Path(args.work)
    resume = args.phase == "resume"
    ctx = RunContext(run_id=None, attempt=2 if resume else 1, db_url=None, run_dir=work, attempt_dir=work / "logs",
                     resume_dir=work / "checkpoints" if resume else None,
                     resume_step=args.resume_step if resume else None)
    sampler = RssSampler()
    run = Run(ctx, run_config.checkpoint, run_config.supervision, config=run_config)
    rank, out = run.rank, {}
    recipe = GPTChar(run_config)
    if resume:
        # GPTChar.setup builds, shards and then loads; time the load on its own.
        real_load = run.load_checkpoint

        def timed_load(state: dict[str, Any] | None = None) -> int:
            dist.barrier()
            began = time.perf_counter()
            base = sampler.reset()
            step = real_load(state)
            dist.barrier()
            out.update(resume_s=time.perf_counter() - began, resume_step=step, resume_peak=sampler.peak,
                       resume_base=base)
            return step

        run.load_checkpoint = timed_load  # type: ignore[method-assign]
        recipe.setup(run)
    else:
        recipe.setup(run)
        params = sum(p.numel() for p in recipe.model.parameters())
        out["params"] = params
        step_times: list[float] = []
        saves: list[dict[str, float]] = []
        step = 0
        pending: dict[str, Any] | None = None
        total = SAVE_EVERY * (args.saves + 1) + 2
        while step < total:
            began = time.perf_counter()
            techniques.set_lr(recipe.optimizer, 1e-4)
            recipe.optimizer.zero_grad(set_to_none=True)
            for x, y in recipe.batches(step):
                with techniques.autocast(run_config.train.precision, run.device):
                    loss = recipe.loss(x, y)
                loss.backward()
            waited = time.perf_counter()
            run.before_update()
            waited = time.perf_counter() - waited
            techniques.optimizer_update(recipe.model, recipe.optimizer, recipe.scaler, 1.0)
            if run.device.type == "cuda":
                torch.cuda.synchronize()
            step += 1
            saving = step % SAVE_EVERY == 0 and step < total - 1
            call_s = 0.0
            if saving:
                if pending is not None:
                    pending["done"].wait()
                dist.barrier()
                base = sampler.reset()
                call_s = time.perf_counter()
                run.save_checkpoint(step, recipe.state(), defer_snapshot=True)
                call_s = time.perf_counter() - call_s
                pending = {"step": step, "base": base, "began": time.perf_counter() - call_s, "call_s": call_s,
                           "done": threading.Event()}
                threading.Thread(target=_wait_durable, args=(work, pending, sampler), daemon=True).start()
            elapsed = time.perf_counter() - began
            step_times.append(elapsed)
            if pending is not None and "wait_s" not in pending and not saving:
                pending["wait_s"] = waited  # before_update of the step after the save
            if pending is not None and pending["done"].is_set() and "recorded" not in pending:
                pending["recorded"] = True
                saves.append({k: v for k, v in pending.items() if isinstance(v, (int, float))})
        if pending is not None and "recorded" not in pending:
            pending["done"].wait()
            saves.append({k: v for k, v in pending.items() if isinstance(v, (int, float))})
        out.update(step_times=step_times, saves=saves)
    sampler.close()
    out["rank"] = rank
    out["maxrss_lifetime"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    (work / f"result-{args.phase}-{rank}.json").write_text(json.dumps(out))
    run.close()
    dist.barrier()
    dist.destroy_process_group()


def _wait_durable(work: Path, pending: dict[str, Any], sampler: RssSampler) -> None:
    """Until ``step-<N>/manifest.json`` exists (rank 0 writes it last): the save is durable."""
    manifest = work / "checkpoints" / f"step-{pending['step']}" / "manifest.json"
    while not manifest.exists():
        time.sleep(0.002)
    pending["wall_s"] = time.perf_counter() - pending["began"]
    pending["peak"] = sampler.peak
    pending["done"].set()


def launch(args: argparse.Namespace, work: Path, phase: str, resume_step: int = 0) -> list[dict[str, Any]]:
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.ranks}", "--master-port",
            str(args.port), __file__, "--rank-main", "--phase", phase, "--work", str(work),
            "--resume-step", str(resume_step), "--layers", str(args.layers), "--embd", str(args.embd),
            "--heads", str(args.heads), "--saves", str(args.saves)] + (["--gpu"] if args.gpu else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // args.ranks)))
    subprocess.run(argv, check=True, env=env)
    return [json.loads((work / f"result-{phase}-{r}.json").read_text()) for r in range(args.ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--embd", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="NCCL and bf16, one GPU per rank")
    parser.add_argument("--port", type=int, default=29611)
    parser.add_argument("--dir", help="where to write (default: a temporary folder, removed)")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="save", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--resume-step", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        saved = launch(args, work, "save")
        last = max(s["step"] for s in saved[0]["saves"])
        resumed = launch(args, work, "resume", last)
        files = sorted((work / "checkpoints" / f"step-{last}").iterdir())
        report(args, saved, resumed, files)


def report(args: argparse.Namespace, saved: list[dict[str, Any]], resumed: list[dict[str, Any]],
           files: list[Path]) -> None:
    mb = 1 << 20
    med = statistics.median
    print(f"model: {saved[0]['params'] / 1e6:.1f}M parameters, {args.ranks} ranks, "
          f"{'NCCL bf16' if args.gpu else 'gloo CPU fp32'}, {len(saved[0]['saves'])} saves")
    print(f"checkpoint: {sum(f.stat().st_size for f in files) / mb:.0f} MiB in {len(files)} files "
          f"({', '.join(f.name for f in files[:6])}{', ...' if len(files) > 6 else ''})")
    for r in saved:
        s = r["saves"]
        print(f"rank {r['rank']}: save peak RSS {med(x['peak'] for x in s) / mb:.0f} MiB "
              f"(+{med(x['peak'] - x['base'] for x in s) / mb:.0f} MiB over before the save)")
    first = saved[0]["saves"]
    normal = med(t for i, t in enumerate(saved[0]["step_times"], 1) if i % SAVE_EVERY not in (0, 1) and i > 2)
    after = [saved[0]["step_times"][int(x["step"]) - 1: int(x["step"]) + 2] for x in first]
    stall = [x["call_s"] + x.get("wait_s", 0.0) for x in first]
    print(f"save wall time (call to durable), rank 0: {med(x['wall_s'] for x in first):.2f} s")
    print(f"stall per save (in save_checkpoint + before_update): {med(stall):.3f} s; "
          f"extra time of the save's step and the next two over a normal one ({normal:.3f} s): "
          f"{med(sum(t) - 3 * normal for t in after):.3f} s")
    print(f"resume (load_checkpoint, step {resumed[0]['resume_step']}): "
          f"{max(r['resume_s'] for r in resumed):.2f} s; peak RSS during it: "
          + ", ".join(f"rank {r['rank']} {r['resume_peak'] / mb:.0f} MiB" for r in resumed))


if __name__ == "__main__":
    main()
