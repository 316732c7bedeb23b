"""How fast the plain-script collector reads what a script leaves behind: protocol and regex
lines from per-rank logs, TensorBoard scalars, and the checkpoint hash.

    .venv/bin/python bench/bench_scriptwatch.py [--lines 200000] [--events 100000] [--mib 512]

Writes, under a temporary folder: 2 ranks' stdout.log with ``--lines`` lines each (every other
one a ``RUNYARD`` line with two metrics, the rest ``iter N: loss X`` read by a regex); one event
file of ``--events`` scalars from torch's SummaryWriter; a ``--mib`` MiB checkpoint. Then times
an AttemptCollector reading the logs to the end (its default 2 MiB per call, 512 KiB per file), EventFiles reading
the event file (5,000 events per call), and CheckpointFiles hashing the file (256 MiB per scan).
Prints points per second and MiB per second, and last its BENCHMARKS.md row
(bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.benchmarks_row import load_average, print_row  # noqa: E402 - needs ROOT on sys.path
from orchestrator.scripts.checkpoint_finder import CheckpointFiles  # noqa: E402
from orchestrator.scripts.metric_collector import AttemptCollector  # noqa: E402


def logs(folder: Path, lines: int) -> Path:
    attempt = folder / "attempt"
    for rank in (0, 1):
        out = attempt / "ranks" / "bench_x" / "attempt_0" / str(rank)
        out.mkdir(parents=True)
        with open(out / "stdout.log", "w") as f:
            for i in range(lines // 2):
                f.write(f'RUNYARD {{"step": {i}, "loss": {1 / (i + 1):.6f}, "lr": 0.0003}}\n')
                f.write(f"iter {i}: loss {1 / (i + 1):.4f}, time 12.3ms\n")
        (out / "stderr.log").touch()
    return attempt


def bench_logs(folder: Path, lines: int) -> tuple[float, float]:
    """Points/s and MiB/s of the collector reading the logs to the end."""
    attempt = logs(folder, lines)
    size = sum(p.stat().st_size for p in attempt.rglob("*.log")) / 2**20
    collector = AttemptCollector(1, 1, attempt, folder, tensorboard_dirs=[], rescan_s=0.0,
                                 stdout_metrics={"iter_loss": r"iter (?P<step>\d+): loss (?P<value>[\d.]+)"})
    start, points, calls = time.perf_counter(), 0, 0
    while True:
        got = collector.collect()
        points += len(got.points)
        calls += 1
        if not got.behind and not got.points:
            break
    took = time.perf_counter() - start
    print(f"logs: {2 * lines:,} lines ({size:.1f} MiB) -> {points:,} points in {took:.2f} s over {calls} calls: "
          f"{points / took:,.0f} points/s, {size / took:.1f} MiB/s")
    return points / took, size / took


def bench_events(folder: Path, events: int) -> float:
    """Scalars/s of EventFiles reading one event file to the end."""
    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - optional: tensorboard, the [scripts] extra

    from orchestrator.scripts.tensorboard_events import EventFiles  # noqa: PLC0415 - optional: tensorboard, the [scripts] extra

    writer = SummaryWriter(str(folder / "runs" / "exp"), max_queue=10_000)
    for step in range(events):
        writer.add_scalar("train/loss", 1 / (step + 1), step)
    writer.close()
    files = EventFiles([folder / "runs"])
    start, points, calls = time.perf_counter(), 0, 0
    while True:
        batch = files.poll()
        points += len(batch)
        calls += 1
        if not files.behind:
            break
    took = time.perf_counter() - start
    print(f"tensorboard: {points:,} scalars in {took:.2f} s over {calls} polls: {points / took:,.0f} scalars/s")
    return points / took


def bench_hash(folder: Path, mib: int) -> float:
    """MiB/s of CheckpointFiles hashing a new checkpoint file."""
    path = folder / "ckpt.pt"
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    files = CheckpointFiles(folder, ["ckpt.pt"])
    files.scan()  # the first look: not stable yet
    start, scans = time.perf_counter(), 0
    while not files.stable_files():
        files.scan()
        scans += 1
    took = time.perf_counter() - start
    again = time.perf_counter()
    files.scan()
    print(f"checkpoint: {mib} MiB hashed in {took:.2f} s over {scans} scans ({mib / took:.0f} MiB/s); "
          f"a scan once hashed: {1000 * (time.perf_counter() - again):.2f} ms")
    return mib / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--mib", type=int, default=512)
    args = parser.parse_args()
    load_at_start = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        points_per_s, log_mib_per_s = bench_logs(Path(tmp) / "logs", args.lines)
        scalars_per_s = bench_events(Path(tmp) / "events", args.events)
        hash_mib_per_s = bench_hash(Path(tmp), args.mib)
    print_row("Reading a script's output", f"the plain-script collector: {2 * args.lines:,} log lines, "
              f"{args.events:,} TensorBoard scalars, a {args.mib} MiB checkpoint hashed",
              f"logs **{points_per_s / 1000:,.0f}k points/s** ({log_mib_per_s:.1f} MiB/s), TensorBoard "
              f"**{scalars_per_s / 1000:,.0f}k scalars/s**, checkpoint sha256 {hash_mib_per_s:,.0f} MiB/s",
              load_at_start)


if __name__ == "__main__":
    main()
