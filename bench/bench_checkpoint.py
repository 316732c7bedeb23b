"""Benchmark: the training-loop stall of an async checkpoint and the writer's bandwidth.

Run from the repository root::

    .venv/bin/python bench/bench_checkpoint.py [--mb 500] [--repeats 5] [--batch 64] [--dir DIR]

It trains a real model on CPU (a stack of 1024x1024 linear layers with AdamW, so the model
plus optimizer state is ~mb MB) and measures, in the same run and interleaved, with medians
over the repeats:

(a) stall: how long the training loop is blocked by an async save the way the built-in
    workloads make it: ``save(defer_snapshot=True)`` after a step, then ``wait_snapshot()``
    before the next ``optimizer.step()`` (the writer copies the state while the next forward
    and backward run). Also: the extra time of that next step over a normal one (the copy
    shares the CPU), the extra time of all steps that run while the save is in flight, and
    the stall of a save that snapshots before returning (``defer_snapshot=False``);
(b) sync: a plain ``torch.save`` of the same state to the same disk, plus fsync;
(c) writer bandwidth: bytes / (total_s - blocked_s) of the background write, with training
    idle (the writer's own speed, the target's measure) and while training goes on;
(d) raw bandwidth: the same number of bytes from a bytes buffer, 8 MB writes, fsync;
(e) the same state through PyTorch Distributed Checkpoint in one process, as a whole state would
    go if runyard saved it through DCP too (issue 31, item 4): DCP's stager copies it on the
    training thread (its reused buffers; DCP has no snapshot beside training on a CPU), then
    ``dcp.save`` writes it (fsync) and the files are hashed for the manifest.

Targets: stall / sync <= 0.10 and writer / raw >= 0.70. Files are removed as it goes. Ends with
its BENCHMARKS.md row (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks_row import load_average, print_row, verdict
from floor import busy_cpu_s
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint import save as dcp_save
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from trainer.checkpoint import CheckpointManager
from trainer.checkpoint.io import _sha256_file

_CHUNK = 8 << 20
_PARAM_NUMEL = 1 << 20  # 4 MB float32 tensors, like a mid-size transformer's matrices


class Loop:
    """A real training loop on CPU: 1024x1024 linear layers, AdamW, ~mb MB of state."""

    def __init__(self, mb: int, batch: int) -> None:
        torch.manual_seed(0)
        layers = max(1, round(mb * (1 << 20) / (3 * 4 * _PARAM_NUMEL)))
        self.model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024, bias=False) for _ in range(layers)))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, 1024)
        self.steps = 0
        self.step()  # creates the optimizer state

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.steps}

    def step(self, before_update: Any = None) -> float:
        """One training step; seconds."""
        started = time.perf_counter()
        loss = self.model(self.x).square().mean()
        loss.backward()
        if before_update is not None:
            before_update()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return time.perf_counter() - started


def state_bytes(state: dict[str, Any]) -> int:
    total = 0

    def visit(obj: Any) -> None:
        nonlocal total
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            for value in obj.values():
                visit(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                visit(value)

    visit(state)
    return total


def sync_torch_save(state: dict[str, Any], path: Path, crc: bool = True) -> float:
    """(b) torch.save to a file, then fsync; seconds. ``crc=False``: without the zip CRC32."""
    torch.serialization.set_crc32_options(crc)
    started = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - started
    torch.serialization.set_crc32_options(True)
    path.unlink()
    return elapsed


def through_dcp(stager: DefaultStager, state: dict[str, Any], folder: Path) -> tuple[float, float]:
    """(e) DCP's staging copy (the training thread's stall), then its write and the files' sha256;
    (stall seconds, bytes per second of the write and hashing)."""
    started = time.perf_counter()
    staged = stager.stage(state)
    stall = time.perf_counter() - started
    began = time.perf_counter()
    dcp_save(staged, storage_writer=FileSystemWriter(folder, sync_files=True), no_dist=True)
    size = 0
    for path in folder.iterdir():
        _sha256_file(path)
        size += path.stat().st_size
    elapsed = time.perf_counter() - began
    shutil.rmtree(folder)
    return stall, size / elapsed


def raw_write(buffer: bytes, path: Path, writeback_every: int = 0) -> float:
    """(d) write a bytes buffer in 8 MB chunks, then fsync; bytes/s.

    With ``writeback_every``, the kernel is asked to start writing back every that many
    bytes (posix_fadvise DONTNEED, as the checkpoint writer does): the disk's best case.
    """
    view = memoryview(buffer)
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        advised = 0
        for offset in range(0, len(view), _CHUNK):
            os.write(fd, view[offset : offset + _CHUNK])
            written = min(offset + _CHUNK, len(view))
            if writeback_every and written - advised >= writeback_every:
                os.posix_fadvise(fd, advised, written - advised, os.POSIX_FADV_DONTNEED)
                advised = written
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - started
    path.unlink()
    return len(buffer) / elapsed


def async_save(manager: CheckpointManager, done: threading.Event, loop: Loop, normal_s: float) -> dict[str, float]:
    """(a) and (c): a deferred-snapshot save as the workloads make it, with training going on."""
    done.clear()
    step = loop.steps
    started = time.perf_counter()
    manager.save(step, loop.state(), metrics={"loss": 1.0}, defer_snapshot=True)
    first = loop.step(before_update=manager.wait_snapshot)  # the next step, as in the workloads
    next_step_extra = time.perf_counter() - started - normal_s
    during = [first]
    while not done.is_set():  # steps that overlap the write (hashing and I/O share the CPU)
        during.append(loop.step())
    result = manager.wait()
    assert result is not None
    manager.delete(step)
    return {
        "stall": result.blocked_s,
        "next_step_extra": next_step_extra,
        "overlap_extra": sum(during) - normal_s * len(during),
        "overlap_steps": len(during),
        "writer_bps": result.bytes / (result.total_s - result.blocked_s),
        "total": result.total_s,
        "bytes": result.bytes,
    }


def eager_save(manager: CheckpointManager, loop: Loop) -> tuple[float, float]:
    """A save that takes its snapshot before returning (defer_snapshot=False), with training
    idle while it writes: its stall, and the writer's bandwidth with the CPU to itself."""
    manager.save(loop.steps, loop.state(), metrics={"loss": 1.0})
    result = manager.wait()
    assert result is not None
    manager.delete(result.step)
    return result.blocked_s, result.bytes / (result.total_s - result.blocked_s)


def normal_step_s(loop: Loop, n: int = 3) -> float:
    return statistics.median(loop.step() for _ in range(n))


def other_load(busy_before: float | None, own_before: float, wall_before: float) -> str:
    """How busy other processes kept the CPUs during the run, to judge the noise."""
    busy_after = busy_cpu_s()
    if busy_before is None or busy_after is None:
        return "unknown"
    own = sum(os.times()[:2]) - own_before
    wall = time.monotonic() - wall_before
    return f"{max(0.0, busy_after - busy_before - own) / wall:.2f} cores of {os.cpu_count()}"


@dataclass
class Samples:
    """Per-repeat measurements, in the order taken."""

    stall_s: list[float] = field(default_factory=list)
    next_step_extra_s: list[float] = field(default_factory=list)
    overlap_extra_s: list[float] = field(default_factory=list)
    overlap_steps: list[float] = field(default_factory=list)
    normal_step_s: list[float] = field(default_factory=list)
    eager_stall_s: list[float] = field(default_factory=list)
    idle_writer_bps: list[float] = field(default_factory=list)
    sync_s: list[float] = field(default_factory=list)
    sync_no_crc_s: list[float] = field(default_factory=list)
    writer_bps: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    raw_bps: list[float] = field(default_factory=list)
    raw_writeback_bps: list[float] = field(default_factory=list)
    dcp_stall_s: list[float] = field(default_factory=list)
    dcp_bps: list[float] = field(default_factory=list)
    cold_stall_s: float = 0.0
    written: int = 0


def measure(loop: Loop, raw_buffer: bytes, work: Path, repeats: int) -> Samples:
    """One warm-up of each kind, then ``repeats`` rounds of all of them, interleaved."""
    samples = Samples()
    done = threading.Event()
    manager = CheckpointManager(work / "checkpoints", async_save=True, on_complete=lambda _: done.set())
    stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False, use_async_staging=False,
                                          use_non_blocking_copy=False))
    try:
        through_dcp(stager, loop.state(), work / "dcp")  # allocates DCP's staging buffers
        samples.cold_stall_s, _ = eager_save(manager, loop)  # allocates the staging buffers
        async_save(manager, done, loop, normal_step_s(loop))
        sync_torch_save(loop.state(), work / "warmup.pt")
        raw_write(raw_buffer, work / "warmup.bin")
        for repeat in range(1, repeats + 1):
            samples.raw_bps.append(raw_write(raw_buffer, work / "raw.bin"))
            samples.raw_writeback_bps.append(raw_write(raw_buffer, work / "raw.bin", writeback_every=64 << 20))
            samples.sync_s.append(sync_torch_save(loop.state(), work / "sync.pt"))
            samples.sync_no_crc_s.append(sync_torch_save(loop.state(), work / "sync.pt", crc=False))
            eager_stall, idle_bps = eager_save(manager, loop)
            samples.eager_stall_s.append(eager_stall)
            samples.idle_writer_bps.append(idle_bps)
            normal = normal_step_s(loop)
            r = async_save(manager, done, loop, normal)
            samples.normal_step_s.append(normal)
            samples.stall_s.append(r["stall"])
            samples.next_step_extra_s.append(r["next_step_extra"])
            samples.overlap_extra_s.append(r["overlap_extra"])
            samples.overlap_steps.append(r["overlap_steps"])
            samples.writer_bps.append(r["writer_bps"])
            samples.total_s.append(r["total"])
            dcp_stall, dcp_bps = through_dcp(stager, loop.state(), work / "dcp")
            samples.dcp_stall_s.append(dcp_stall)
            samples.dcp_bps.append(dcp_bps)
            samples.written = int(r["bytes"])
            print(
                f"  repeat {repeat}: stall {r['stall'] * 1e3:6.1f} ms "
                f"(eager snapshot {samples.eager_stall_s[-1] * 1e3:5.1f} ms) | "
                f"step {normal * 1e3:5.0f} ms, next step +{r['next_step_extra'] * 1e3:5.1f} ms, "
                f"{r['overlap_steps']} steps during the save +{r['overlap_extra'] * 1e3:5.1f} ms | "
                f"sync torch.save+fsync {samples.sync_s[-1]:.3f} s | writer {r['writer_bps'] / 1e6:5.0f} MB/s "
                f"(total {r['total']:.3f} s) | raw {samples.raw_bps[-1] / 1e6:5.0f} MB/s "
                f"({samples.raw_writeback_bps[-1] / 1e6:.0f} with early write-back) | "
                f"DCP: stall {dcp_stall * 1e3:.1f} ms, {dcp_bps / 1e6:.0f} MB/s"
            )
    finally:
        manager.close()
        stager.close()
    return samples


def report(samples: Samples, repeats: int, load_at_start: float) -> None:
    """Print the medians and the two target ratios, then the BENCHMARKS.md row."""
    med = statistics.median
    stall, sync, total = med(samples.stall_s), med(samples.sync_s), med(samples.total_s)
    writer_bps, raw_bps = med(samples.idle_writer_bps), med(samples.raw_bps)
    cold_ms, no_crc_ms = samples.cold_stall_s * 1e3, med(samples.sync_no_crc_s) * 1e3
    stall_ratio, bw_ratio = stall / sync, writer_bps / raw_bps
    paired_stall = med(a / b for a, b in zip(samples.stall_s, samples.sync_s, strict=True))
    paired_bw = med(a / b for a, b in zip(samples.idle_writer_bps, samples.raw_bps, strict=True))
    print(f"\nmedians over {repeats} repeats ({samples.written / 1e6:.0f} MB written per checkpoint):")
    print(f"  (a) training loop blocked      {stall * 1e3:7.1f} ms    (save() + wait_snapshot(); a save that "
          f"snapshots before returning: {med(samples.eager_stall_s) * 1e3:.1f} ms; "
          f"the first one, allocating: {cold_ms:.0f} ms)")
    print(f"      normal step {med(samples.normal_step_s) * 1e3:.0f} ms; the step after save() took "
          f"+{med(samples.next_step_extra_s) * 1e3:.1f} ms; the {med(samples.overlap_steps):.0f} steps during the save "
          f"took +{med(samples.overlap_extra_s) * 1e3:.1f} ms in all (the copy, hashing and I/O share the CPU)")
    print(f"  (b) sync torch.save + fsync   {sync * 1e3:7.1f} ms    (without zip CRC32: {no_crc_ms:.0f} ms)")
    print(f"  (c) background writer         {writer_bps / 1e6:7.0f} MB/s  (training idle; while training: "
          f"{med(samples.writer_bps) / 1e6:.0f} MB/s, save() to durable {total:.3f} s)")
    print(f"  (d) raw write + fsync         {raw_bps / 1e6:7.0f} MB/s  "
          f"(with early write-back, as the writer does: {med(samples.raw_writeback_bps) / 1e6:.0f} MB/s)")
    print(f"  stall / sync = {stall_ratio:.3f}  (median of per-repeat ratios {paired_stall:.3f}; "
          f"target <= 0.10: {'met' if stall_ratio <= 0.10 else 'MISSED'})")
    print(f"  next-step extra / sync = {med(samples.next_step_extra_s) / sync:.3f}; "
          f"all steps' extra during the save / sync = {med(samples.overlap_extra_s) / sync:.3f}")
    print(f"  writer / raw = {bw_ratio:.3f}  (median of per-repeat ratios {paired_bw:.3f}; "
          f"target >= 0.70: {'met' if bw_ratio >= 0.70 else 'MISSED'})")
    print(f"  writer / raw with early write-back = {writer_bps / med(samples.raw_writeback_bps):.3f}")
    dcp_stall, dcp_bps = med(samples.dcp_stall_s), med(samples.dcp_bps)
    print(f"  (e) through DCP: training blocked {dcp_stall * 1e3:.1f} ms ({dcp_stall / stall:.1f}x (a)); write + "
          f"sha256 {dcp_bps / 1e6:.0f} MB/s ({dcp_bps / writer_bps:.2f}x (c))")
    print_row("Checkpoint save", "an async save's training stall and the writer's bandwidth "
              f"({samples.written / 1e6:.0f} MB of model + AdamW on CPU) against a sync save and a raw write; and "
              "through DCP",
              f"training blocked **{stall * 1e3:.1f} ms** against a sync save's {sync * 1e3:.0f} ms: "
              f"{stall_ratio:.3f} (target <= 0.10: {verdict(stall_ratio <= 0.10)}); writer {writer_bps / 1e6:,.0f} "
              f"MB/s, **{bw_ratio:.2f}x** a raw write's (target >= 0.70: {verdict(bw_ratio >= 0.70)}); through DCP "
              f"blocked {dcp_stall * 1e3:.1f} ms, {dcp_bps / 1e6:,.0f} MB/s ({dcp_bps / writer_bps:.2f}x the writer); "
              f"medians of {repeats}", load_at_start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=500, help="size of the state in MiB")
    parser.add_argument("--repeats", type=int, default=5, help="measured repeats (after one warm-up)")
    parser.add_argument("--batch", type=int, default=64, help="rows per training step")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads for training (default: torch's, all cores); 1 leaves the "
                             "other cores to the writer, as on a GPU machine where training does not use the CPU")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    load_at_start = load_average()

    if args.threads:
        torch.set_num_threads(args.threads)
    loop = Loop(args.mb, args.batch)
    raw_buffer = os.urandom(state_bytes(loop.state()))
    work = Path(tempfile.mkdtemp(prefix="runyard-bench-ckpt-", dir=args.dir))
    print(
        f"state: {len(raw_buffer) / 1e6:.0f} MB of float32 tensors (model + AdamW); batch {args.batch}; "
        f"torch threads {torch.get_num_threads()}; dir: {work}; cpus: {os.cpu_count()}; "
        f"torch {torch.__version__}; load average before: {os.getloadavg()[0]:.2f}"
    )
    busy_before, own_before, wall_before = busy_cpu_s(), sum(os.times()[:2]), time.monotonic()
    try:
        samples = measure(loop, raw_buffer, work, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"CPU used by other processes during the measurements: {other_load(busy_before, own_before, wall_before)}")
    report(samples, args.repeats, load_at_start)


if __name__ == "__main__":
    main()
