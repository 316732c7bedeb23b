"""Where a test tier's CPU goes: every process's CPU time, by test and by kind of process.

    .venv/bin/python tools/cpu_by_test.py sample OUT.json &   # beside a tier; SIGTERM writes OUT.json
    .venv/bin/python -m pytest tests/faults tests/integration -n 3 --dist loadgroup
    kill -TERM %1; wait
    .venv/bin/python tools/cpu_by_test.py report OUT.json

``sample`` reads every process's CPU time (user + system) every 0.25 s and attributes it to the
test whose folder holds the ``RUNYARD_HOME`` in the process's environment, and to a kind of
process (rank, torchrun agent, shim, scheduler, UI, a ``runyard`` CLI verb, pytest, ...).
What a process spends after its last sample is missed, so short-lived processes (a CLI call) are
undercounted. docs/benchmarks-journal.md ("The test suite") has what it found.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import sys
import time

import psutil


def kind(argv: list[str]) -> str:
    line = " ".join(argv)
    if "trainer.agent.torchrun" in line and "orchestrator.executors.shim" in line:
        return "shim"
    if "trainer.agent.torchrun" in line:
        return "agent"
    if "trainer.process.script_runner" in line:
        return "rank:script"
    if "-m trainer" in line:
        return "rank"
    if "orchestrator scheduler" in line:
        return "scheduler"
    if "streamlit" in line or "orchestrator ui" in line or "orchestrator up" in line:
        return "ui"
    if "orchestrator" in line:
        return "cli:" + (argv[3] if len(argv) > 3 else "?")
    if "pytest" in line or "execnet" in line or "exec(eval(" in line:
        return "pytest"
    if "postgres" in line:
        return "postgres"
    if "slurm" in line or "munge" in line:
        return "slurm"
    if "chrom" in line:
        return "chromium"
    return "other:" + (os.path.basename(argv[0]) if argv else "?")


def sample(out: str, every_s: float = 0.25) -> None:
    seen: dict[tuple[int, float], list] = {}  # (pid, create time) -> [cpu, test, kind]
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while not stop:
        for proc in psutil.process_iter(["pid", "create_time"]):
            if proc.pid == os.getpid():
                continue
            key = (proc.pid, proc.info["create_time"])
            try:
                times = proc.cpu_times()
                cpu = times.user + times.system
                if key in seen:
                    seen[key][0] = cpu
                    continue
                home = proc.environ().get("RUNYARD_HOME", "")
                found = re.search(r"/(test_[^/]+?)\d*/", home)
                seen[key] = [cpu, found.group(1) if found else (home or "-"), kind(proc.cmdline())]
            except (psutil.Error, OSError):
                continue
        time.sleep(every_s)
    with open(out, "w") as f:
        json.dump(list(seen.values()), f)


def report(path: str) -> None:
    with open(path) as f:
        rows = json.load(f)
    by_kind: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    by_test: collections.Counter[str] = collections.Counter()
    for cpu, test, what in rows:
        group = "cli" if what.startswith("cli:") else what
        by_kind[group] += cpu
        count[group] += 1
        by_test[test] += cpu
    print(f"all processes: {sum(by_kind.values()):.0f} s of CPU")
    for what, cpu in by_kind.most_common(12):
        print(f"  {what:12s} {cpu:7.0f} s  {count[what]:4d} processes  {cpu / count[what]:.2f} s each")
    print("tests:")
    for test, cpu in by_test.most_common(30):
        print(f"  {cpu:6.1f} s  {test}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("sample", "report"):
        sys.exit(__doc__)
    (sample if sys.argv[1] == "sample" else report)(sys.argv[2])
