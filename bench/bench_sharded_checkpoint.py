"""Benchmark: an FSDP model's checkpoint gathered to rank 0 (how runyard saved it before issue 31)
against sharded through DCP (how it saves it now), side by side in one run on the same ranks.

Run from the repository root::

    .venv/bin/python bench/bench_sharded_checkpoint.py [--ranks 4] [--layers 16] [--embd 768] \
        [--repeats 3] [--dir DIR]

It starts ``--ranks`` CPU processes (gloo), shards a gpt-char model (``--layers`` blocks of width
``--embd``: 113M parameters by default) with FSDP2 and AdamW, trains one step so that the
optimizer state exists (model + optimizer: 1.36 GB), then saves it ``--repeats`` times each way,
alternating, through runyard's CheckpointManager:

- gathered: ``get_model_state_dict`` / ``get_optimizer_state_dict`` with ``full_state_dict=True,
  cpu_offload=True`` (the whole state on rank 0's CPU), then rank 0 writes it as one ``state.pt``;
- sharded: the sharded state dicts (DTensors), every rank writing its own shards through DCP.

For each save and rank: the peak RSS over the save above the RSS before it (``VmHWM``, reset
through ``/proc/self/clear_refs``; each save has a manager of its own, so it pays for its staging
memory, as a run's first save does, and a training run's writer keeps that memory between
saves), the training stall (time in ``save()``, where training waits: the gather and snapshot,
or the staging of the rank's shards) and the save's wall time until it is durable on every rank.
Then the resume time of each format on the same ranks (verify, read, load into the model and
optimizer). Medians are printed; the target is rank 0's peak within 1.5x of the other ranks'
(instead of holding the whole state). Rank 0 ends with the BENCHMARKS.md row
(bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from bench.benchmarks_row import load_average, print_row, verdict
from trainer.checkpoint import CheckpointManager
from trainer.workloads.gpt_char import GPT, ShardedModelState, ShardedOptimizerState


def rss_mib(field: str) -> float:
    """``VmRSS`` or ``VmHWM`` of this process, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Give freed memory back to the system, then VmHWM := VmRSS (Linux >= 4.0)."""
    _LIBC.malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")


_LIBC = ctypes.CDLL("libc.so.6")
_M_MMAP_THRESHOLD = -3


def fixed_mmap_threshold() -> None:
    """Allocations of 1 MiB and more straight from mmap, and back to the system when freed. By
    default glibc raises the threshold after a large block is freed (up to 32 MiB): the gathered
    save's freed state then stays resident in the heap and hides every later save's peak."""
    _LIBC.mallopt(_M_MMAP_THRESHOLD, 1 << 20)


def rank_main(rank: int, world: int, folder: str, layers: int, embd: int, repeats: int,
              load_at_start: float) -> None:
    root = Path(folder)
    fixed_mmap_threshold()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = GPT(65, layers, 12, embd, 64)
    params = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 65, (1, 32))
    model(x).float().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model_state, optim_state = ShardedModelState(model), ShardedOptimizerState(model, optimizer)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)

    def payload(mode: str) -> dict[str, Any]:
        if mode == "gathered":
            return {"model": get_model_state_dict(model, options=full),
                    "optimizer": get_optimizer_state_dict(model, optimizer, options=full)}
        return {"model": model_state.state_dict(), "optimizer": optim_state.state_dict()}

    rows: list[dict[str, Any]] = []
    for repeat in range(repeats):
        for mode in ("gathered", "sharded") if repeat % 2 == 0 else ("sharded", "gathered"):
            # A manager of its own per save, closed after it: each save pays for its staging memory
            # (a training run's writer keeps it between saves), and none inherits the other's.
            manager = CheckpointManager(root / mode, is_writer=rank == 0, async_save=True)
            gc.collect()
            dist.barrier()
            reset_peak()
            before = rss_mib("VmRSS")
            started = time.perf_counter()
            state = payload(mode)
            if mode == "gathered" and rank != 0:
                state = {"model": {}, "optimizer": {}}  # what the other ranks hold: nothing
            if rank == 0 or mode == "sharded":
                manager.save(repeat + 1, state)
            stall = time.perf_counter() - started
            del state
            manager.wait()
            dist.barrier()
            wall = time.perf_counter() - started
            peak = rss_mib("VmHWM") - before
            manager.close()
            rows.append({"rank": rank, "mode": mode, "stall_s": stall, "wall_s": wall, "peak_mib": peak})
    for mode in ("gathered", "sharded"):  # resume: every rank verifies, reads and loads
        gc.collect()
        dist.barrier()
        started = time.perf_counter()
        reader = CheckpointManager(root / mode, is_writer=False)
        if mode == "gathered":
            _, saved = reader.load(repeats)
            whole = StateDictOptions(full_state_dict=True)
            set_model_state_dict(model, saved["model"], options=whole)
            set_optimizer_state_dict(model, optimizer, saved["optimizer"], options=whole)
        else:
            _, saved = reader.load(repeats, targets=lambda: {"model": model_state.state_dict(),
                                                             "optimizer": optim_state.state_dict()})
            model_state.load_state_dict(saved["model"])
            optim_state.load_state_dict(saved["optimizer"])
        del saved
        dist.barrier()
        rows.append({"rank": rank, "mode": mode, "resume_s": time.perf_counter() - started})
    sizes = {mode: sum(f.stat().st_size for f in (root / mode / f"step-{repeats}").iterdir())
             for mode in ("gathered", "sharded")}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        report(gathered, world, params, sizes, repeats, load_at_start)
    dist.destroy_process_group()


def report(per_rank: list[list[dict[str, Any]]], world: int, params: int, sizes: dict[str, int], repeats: int,
           load_at_start: float) -> None:
    rows = [row for rank_rows in per_rank for row in rank_rows]

    def median(mode: str, key: str, ranks: range | list[int]) -> float:
        return statistics.median(r[key] for r in rows if r["mode"] == mode and key in r and r["rank"] in ranks)

    others = list(range(1, world))
    print(f"{params / 1e6:.0f}M parameters, AdamW, {world} CPU ranks (gloo), {repeats} saves each way, alternating; "
          f"checkpoint {sizes['gathered'] / 2**30:.2f} GiB gathered, {sizes['sharded'] / 2**30:.2f} GiB sharded")
    print(f"{'':>9} {'rank 0 peak':>12} {'others peak':>12} {'ratio':>6} {'stall':>8} {'save wall':>10} {'resume':>8}")
    for mode in ("gathered", "sharded"):
        peak0, peak_others = median(mode, "peak_mib", [0]), median(mode, "peak_mib", others)
        print(f"{mode:>9} {peak0:>8.0f} MiB {peak_others:>8.0f} MiB {peak0 / max(peak_others, 1):>5.1f}x "
              f"{median(mode, 'stall_s', [0]):>7.2f}s {median(mode, 'wall_s', [0]):>9.2f}s "
              f"{median(mode, 'resume_s', list(range(world))):>7.2f}s")
    print("peak: the RSS over a save above the RSS before it (median over the saves); stall: rank 0's time in "
          "save() (gather + snapshot, or staging its shards); save wall: until durable on every rank; resume: "
          "verify + read + load into model and optimizer, every rank")
    peak0, peak_others = median("sharded", "peak_mib", [0]), median("sharded", "peak_mib", others)
    ratio = peak0 / max(peak_others, 1)
    everyone = list(range(world))
    print_row("FSDP checkpoint, sharded", f"an FSDP2 gpt-char ({params / 1e6:.3g}M parameters, {world} CPU ranks) "
              "saved sharded through DCP against gathered to rank 0, taking turns",
              f"rank 0's peak **+{peak0:,.0f} MiB**, the others' +{peak_others:,.0f} MiB: **{ratio:.1f}x** (target "
              f"<= 1.5x: {verdict(ratio <= 1.5)}); training stall {median('sharded', 'stall_s', [0]):.2f} s "
              f"(gathered {median('gathered', 'stall_s', [0]):.2f} s); durable on every rank "
              f"{median('sharded', 'wall_s', [0]):.2f} s ({median('gathered', 'wall_s', [0]):.2f} s); resume "
              f"{median('sharded', 'resume_s', everyone):.2f} s ({median('gathered', 'resume_s', everyone):.2f} s); "
              f"medians of {repeats} saves", load_at_start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--embd", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the checkpoints go (default: a temporary folder)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="runyard-bench-sharded-", dir=args.dir))
    try:
        load_at_start = load_average()
        print(f"load average before: {load_at_start:.1f}")
        mp.start_processes(rank_main, args=(args.ranks, str(folder), args.layers, args.embd, args.repeats,
                                            load_at_start), nprocs=args.ranks, start_method="spawn")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
