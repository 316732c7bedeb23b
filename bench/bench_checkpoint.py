"""Benchmark: the training-thread stall of an async checkpoint and the writer's bandwidth.

Run from the repository root::

    .venv/bin/python bench/bench_checkpoint.py [--mb 500] [--repeats 5] [--dir DIR]

It builds a model/optimizer-like state of float32 tensors on CPU and measures, in the same
run and interleaved, with medians over the repeats:

(a) stall: how long ``CheckpointManager(async_save=True).save()`` blocks the caller;
(b) sync: a plain ``torch.save`` of the same state to the same disk, plus fsync;
(c) writer bandwidth: bytes / (total_s - blocked_s) of the background write;
(d) raw bandwidth: the same number of bytes from a bytes buffer, 8 MB writes, fsync.

Targets: stall / sync <= 0.10 and writer / raw >= 0.70. Files are removed as it goes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.checkpoint import CheckpointManager  # noqa: E402

_CHUNK = 8 << 20
_PARAM_NUMEL = 1 << 20  # 4 MB float32 tensors, like a mid-size transformer's matrices


def build_state(mb: int) -> dict[str, Any]:
    """A model state dict plus Adam-like optimizer state (exp_avg, exp_avg_sq), ~mb MB."""
    n_params = max(1, round(mb * (1 << 20) / (3 * 4 * _PARAM_NUMEL)))
    model = {f"layers.{i}.weight": torch.randn(_PARAM_NUMEL) for i in range(n_params)}
    optim_state = {
        i: {"step": torch.tensor(100.0), "exp_avg": torch.randn(_PARAM_NUMEL), "exp_avg_sq": torch.rand(_PARAM_NUMEL)}
        for i in range(n_params)
    }
    param_groups = [{"lr": 3e-4, "betas": (0.9, 0.999), "eps": 1e-8, "params": list(range(n_params))}]
    return {"model": model, "optimizer": {"state": optim_state, "param_groups": param_groups}, "step": 100}


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


def async_save(manager: CheckpointManager, step: int, state: dict[str, Any]) -> tuple[float, float, float, int]:
    """(a) and (c): stall of save(), writer bandwidth, total time, bytes."""
    manager.save(step, state, metrics={"loss": 1.0})
    result = manager.wait()
    assert result is not None
    manager.delete(step)
    return result.blocked_s, result.bytes / (result.total_s - result.blocked_s), result.total_s, result.bytes


def busy_cpu_s() -> float | None:
    """CPU seconds all processes have used since boot (Linux /proc/stat), or None."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


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
    sync_s: list[float] = field(default_factory=list)
    sync_no_crc_s: list[float] = field(default_factory=list)
    writer_bps: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    raw_bps: list[float] = field(default_factory=list)
    raw_writeback_bps: list[float] = field(default_factory=list)
    cold_stall_s: float = 0.0
    written: int = 0


def measure(state: dict[str, Any], raw_buffer: bytes, work: Path, repeats: int) -> Samples:
    """One warm-up of each kind, then ``repeats`` rounds of all of them, interleaved."""
    samples = Samples()
    manager = CheckpointManager(work / "checkpoints", async_save=True)
    try:
        samples.cold_stall_s, *_ = async_save(manager, 0, state)  # allocates the staging buffers
        sync_torch_save(state, work / "warmup.pt")
        raw_write(raw_buffer, work / "warmup.bin")
        for repeat in range(1, repeats + 1):
            samples.raw_bps.append(raw_write(raw_buffer, work / "raw.bin"))
            samples.raw_writeback_bps.append(raw_write(raw_buffer, work / "raw.bin", writeback_every=64 << 20))
            samples.sync_s.append(sync_torch_save(state, work / "sync.pt"))
            samples.sync_no_crc_s.append(sync_torch_save(state, work / "sync.pt", crc=False))
            stall, bps, total, samples.written = async_save(manager, repeat, state)
            samples.stall_s.append(stall)
            samples.writer_bps.append(bps)
            samples.total_s.append(total)
            print(
                f"  repeat {repeat}: stall {stall * 1e3:6.1f} ms | sync torch.save+fsync {samples.sync_s[-1]:.3f} s | "
                f"writer {bps / 1e6:5.0f} MB/s (total {total:.3f} s) | raw {samples.raw_bps[-1] / 1e6:5.0f} MB/s "
                f"({samples.raw_writeback_bps[-1] / 1e6:.0f} with early write-back)"
            )
    finally:
        manager.close()
    return samples


def report(samples: Samples, repeats: int) -> None:
    """Print the medians and the two target ratios."""
    med = statistics.median
    stall, sync, total = med(samples.stall_s), med(samples.sync_s), med(samples.total_s)
    writer_bps, raw_bps = med(samples.writer_bps), med(samples.raw_bps)
    cold_ms, no_crc_ms = samples.cold_stall_s * 1e3, med(samples.sync_no_crc_s) * 1e3
    stall_ratio, bw_ratio = stall / sync, writer_bps / raw_bps
    paired_stall = med(a / b for a, b in zip(samples.stall_s, samples.sync_s))
    paired_bw = med(a / b for a, b in zip(samples.writer_bps, samples.raw_bps))
    print(f"\nmedians over {repeats} repeats ({samples.written / 1e6:.0f} MB written per checkpoint):")
    print(f"  (a) async save() stall        {stall * 1e3:7.1f} ms    (first save, allocating: {cold_ms:.0f} ms)")
    print(f"  (b) sync torch.save + fsync   {sync * 1e3:7.1f} ms    (without zip CRC32: {no_crc_ms:.0f} ms)")
    print(f"  (c) background writer         {writer_bps / 1e6:7.0f} MB/s  (save() to durable: {total:.3f} s)")
    print(f"  (d) raw write + fsync         {raw_bps / 1e6:7.0f} MB/s  "
          f"(with early write-back, as the writer does: {med(samples.raw_writeback_bps) / 1e6:.0f} MB/s)")
    print(f"  stall / sync = {stall_ratio:.3f}  (median of per-repeat ratios {paired_stall:.3f}; "
          f"target <= 0.10: {'met' if stall_ratio <= 0.10 else 'MISSED'})")
    print(f"  writer / raw = {bw_ratio:.3f}  (median of per-repeat ratios {paired_bw:.3f}; "
          f"target >= 0.70: {'met' if bw_ratio >= 0.70 else 'MISSED'})")
    print(f"  writer / raw with early write-back = {writer_bps / med(samples.raw_writeback_bps):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=500, help="size of the state in MiB")
    parser.add_argument("--repeats", type=int, default=5, help="measured repeats (after one warm-up)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    state = build_state(args.mb)
    raw_buffer = os.urandom(state_bytes(state))
    work = Path(tempfile.mkdtemp(prefix="runyard-bench-ckpt-", dir=args.dir))
    print(
        f"state: {len(raw_buffer) / 1e6:.0f} MB of float32 tensors; dir: {work}; cpus: {os.cpu_count()}; "
        f"torch {torch.__version__}; load average before: {os.getloadavg()[0]:.2f}"
    )
    busy_before, own_before, wall_before = busy_cpu_s(), sum(os.times()[:2]), time.monotonic()
    try:
        samples = measure(state, raw_buffer, work, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"CPU used by other processes during the measurements: {other_load(busy_before, own_before, wall_before)}")
    report(samples, args.repeats)


if __name__ == "__main__":
    main()
