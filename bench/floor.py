"""Start the floor (bench/floor_ddp.py under a bare torchrun) and time it: launch to first step.

Imported by bench_recovery.py and bench_spine.py, which run it interleaved with runyard's own
launches so that both see the same machine. Alone:

    .venv/bin/python bench/floor.py [--runs 5] [--nproc 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR_SCRIPT = Path(__file__).resolve().parent / "floor_ddp.py"


def busy_cpu_s() -> float | None:
    """CPU seconds all processes have used since boot (Linux /proc/stat), or None."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def floor_start(nproc: int = 2, timeout: float = 300.0) -> float:
    """Seconds from starting ``torchrun`` (``python -m torch.distributed.run``) to rank 0's first
    optimizer step of the floor script; raises RuntimeError when it fails."""
    with tempfile.TemporaryDirectory(prefix="runyard-floor-") as tmp:
        out = Path(tmp) / "first_step.json"
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(FLOOR_SCRIPT), str(out)]
        started = time.time()
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        if result.returncode != 0 or not out.exists():
            raise RuntimeError(f"the floor exited {result.returncode}: {result.stderr[-2000:]}")
        return float(json.loads(out.read_text())["first_step_at"]) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    times = [floor_start(args.nproc) for _ in range(args.runs)]
    print("floor launch -> first step: " + ", ".join(f"{t:.2f}" for t in times)
          + f"  median {statistics.median(times):.2f} s")


if __name__ == "__main__":
    main()
