"""What one refresh of a live run's Run page costs: bytes the browser receives and the UI's CPU.

    .venv/bin/python bench/bench_live_bytes.py [--ranks 8] [--steps 10000] [--window 20] [--rounds 3]
        [--before REV] [--section Metrics]

(``bench/bench_render.py --live-bytes`` runs the same.) A simulated live run: one RUNNING run of
``ranks`` ranks logging ``loss`` and ``lr`` whose first ``steps`` steps are written at once, then
a writer process appends 10 steps a second on every rank through rank 0's write path
(bench/seed.py's ``point_batches`` and ``db.metricstore.write_points``, rollups included) while
the UI shows it; no scheduler, no training. Two UIs serve the same data folder: this checkout
("after") and, with ``--before REV``, the commit REV exported to a temporary folder ("before").
In rounds, each opens the run's section in Chromium (a fresh context), waits for every chart to
be drawn, then for ``window`` seconds records the size of every WebSocket frame the page receives
(Chromium's DevTools protocol, ``Network.webSocketFrameReceived``) and the CPU seconds of the UI's
process tree (psutil). A refresh is the page's 2-s live tick: the bytes and CPU of the window
divided by its ticks. Prints each round and the medians, and the BENCHMARKS.md rows.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.benchmarks_row import load_average, print_row  # noqa: E402 - needs ROOT on sys.path
from bench.seed import STEP_S, point_batches  # noqa: E402 - needs ROOT on sys.path
from db.engine import make_engine, make_sessionmaker, upgrade  # noqa: E402 - needs ROOT on sys.path
from db.metricstore import write_points  # noqa: E402 - needs ROOT on sys.path

KEYS = ("loss", "lr")
TICK_S = 2.0  # the Run page's live refresh (app/views/run.py's ACTIVE_REFRESH_S)
APPEND_STEPS_PER_S = 10
ALL_DRAWN = """() => {
    const app = document.querySelector("[data-testid='stApp']");
    if (!app || app.getAttribute("data-test-script-state") !== "notRunning") return false;
    const charts = [...document.querySelectorAll("[data-testid='stVegaLiteChart'], .runyard-live")];
    return charts.length > 0 && charts.every(c => c.querySelector('svg.marks, canvas'));
}"""


def create_live_run(db_url: str, ranks: int, steps: int, pid: int | None = None) -> int:
    """A RUNNING run of one RUNNING attempt on ``ranks`` ranks that started ``steps`` steps ago;
    with ``pid``, the attempt is that process (a scheduler finds it alive and leaves it running)."""
    from db.models import Attempt  # noqa: PLC0415 - the bench's own imports, after sys.path
    from db.requests import create_run  # noqa: PLC0415
    from db.states import RunStatus, transition  # noqa: PLC0415
    from db.vocabulary.config import RunConfig  # noqa: PLC0415
    from db.vocabulary.cost import Price  # noqa: PLC0415

    engine = make_engine(db_url)
    database = engine.url.database
    assert database, db_url
    start = time.time() - steps * STEP_S
    try:
        with make_sessionmaker(engine)() as s:
            config = RunConfig.model_validate({"name": "live-simulated", "train": {"max_steps": 10_000_000}})
            run = create_run(s, config, Path(database).parent / "runs", Price(usd_per_hour=1.0, unit="seeded"))
            s.flush()
            for status in (RunStatus.STARTING, RunStatus.RUNNING):
                transition(s, run.id, status, "seeded by bench/bench_live_bytes.py")
            run.nproc, run.started_at = ranks, start
            s.add(Attempt(run_id=run.id, number=1, status="RUNNING", dir=str(Path(run.run_dir) / "attempts" / "1"),
                          started_at=start, first_step_at=start + STEP_S, progress_at=time.time(),
                          last_step=steps, resume_step=0, pid=pid,
                          pid_create_time=psutil.Process(pid).create_time() if pid is not None else None))
            s.commit()
            return int(run.id)
    finally:
        engine.dispose()


def write(db_url: str, run_id: int, ranks: int, first: int, last: int, start: float,
          keys: tuple[str, ...] = KEYS) -> None:
    """Steps ``first``..``last`` of the run, every rank and key, through ``write_points``."""
    engine = make_engine(db_url)
    try:
        for rows in point_batches(run_id, ranks, last, keys, 50_000, start, seed=run_id):
            rows = [r for r in rows if r["step"] >= first]
            if rows:
                with engine.begin() as conn:
                    write_points(conn, rows)
    finally:
        engine.dispose()


def writer(db_url: str, run_id: int, ranks: int, steps: int) -> None:
    """The simulated ranks: 10 steps a second appended after ``steps``, until killed."""
    start = time.time() - steps * STEP_S
    step = steps
    while True:
        t0 = time.monotonic()
        write(db_url, run_id, ranks, step + 1, step + APPEND_STEPS_PER_S // 2, start)
        step += APPEND_STEPS_PER_S // 2
        time.sleep(max(0.0, 0.5 - (time.monotonic() - t0)))


def tree_at(rev: str) -> Path:
    """The commit ``rev`` of this repository exported to a temporary folder."""
    out = Path(tempfile.mkdtemp(prefix="runyard-before-"))
    archive = out / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), rev], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    archive.unlink()
    return out


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of the process ``pid`` and its children."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            times = p.cpu_times()
            total += times.user + times.system
    except psutil.NoSuchProcess:
        pass
    return total


def measure(browser: Any, cookies: list[dict[str, Any]], url: str, pid: int, window: float) -> dict[str, float]:
    """One round: the section opened in a fresh context, every chart drawn; then ``window``
    seconds of WebSocket frames and UI CPU. Returns the seconds from the address to every chart
    drawn (a new tab, nothing cached), bytes of the first load, per tick after it, the largest
    frame after it, and CPU seconds per tick."""
    from bench.bench_render import fresh_context  # noqa: PLC0415 - bench_render imports this module

    context = fresh_context(browser, cookies)
    try:
        page = context.new_page()
        cdp = context.new_cdp_session(page)
        cdp.send("Network.enable")
        frames: list[tuple[float, int]] = []
        cdp.on("Network.webSocketFrameReceived", lambda e: frames.append(
            (time.monotonic(), len(e["response"]["payloadData"]) * (3 if e["response"]["opcode"] == 2 else 4) // 4)))
        opened = time.monotonic()
        page.goto(url)
        page.wait_for_function(ALL_DRAWN, timeout=120_000)
        drawn_s = time.monotonic() - opened
        page.wait_for_timeout(2500)  # one tick more: the first refresh after the load
        first = sum(n for _, n in frames)
        t0, c0, seen = time.monotonic(), cpu_s(pid), len(frames)
        page.wait_for_timeout(window * 1000)
        t1, c1 = time.monotonic(), cpu_s(pid)
        after = [n for at, n in frames[seen:] if at <= t1]
        ticks = (t1 - t0) / TICK_S
        return {"drawn_s": drawn_s, "first_bytes": first, "bytes_per_tick": sum(after) / ticks,
                "largest_frame": max(after, default=0), "cpu_per_tick": (c1 - c0) / ticks}
    finally:
        context.close()


def run(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - optional: the test extra

    from bench.bench_render import free_port, launch_chromium, session_cookies, start_ui  # noqa: PLC0415

    home = Path(tempfile.mkdtemp(prefix="runyard-bench-live-bytes-"))
    db_url = f"sqlite:///{home / 'runyard.db'}"
    upgrade(db_url)
    run_id = create_live_run(db_url, args.ranks, args.steps)
    write(db_url, run_id, args.ranks, 1, args.steps, time.time() - args.steps * STEP_S)
    trees = {"after": ROOT}
    if args.before:
        trees = {"before": tree_at(args.before), **trees}
    procs: list[subprocess.Popen[bytes]] = []
    feeder = subprocess.Popen([sys.executable, __file__, "--write", db_url, str(run_id), str(args.ranks),
                               str(args.steps)], start_new_session=True)
    procs.append(feeder)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        uis = {}
        for name, tree in trees.items():
            ui, login = start_ui(home, free_port(), tree)
            procs.append(ui)
            uis[name] = (ui.pid, login)
        with sync_playwright() as pw:
            browser = launch_chromium(pw)
            cookies = {name: session_cookies(browser, login) for name, (_, login) in uis.items()}
            for r in range(args.rounds):
                for name, (pid, login) in uis.items():
                    url = f"{login.split('/?token=')[0]}/run?run={run_id}&section={args.section}"
                    m = measure(browser, cookies[name], url, pid, args.window)
                    results[name].append(m)
                    print(f"round {r + 1} {name}: charts drawn {m['drawn_s']:.2f} s, first load "
                          f"{m['first_bytes'] / 1e3:,.0f} kB; per refresh "
                          f"{m['bytes_per_tick'] / 1e3:,.1f} kB (largest frame {m['largest_frame'] / 1e3:,.1f} kB), "
                          f"UI CPU {m['cpu_per_tick'] * 1e3:,.0f} ms", flush=True)
            browser.close()
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(home, ignore_errors=True)
        if "before" in trees:
            shutil.rmtree(trees["before"], ignore_errors=True)
    return results


def median(rows: list[dict[str, float]], field: str) -> float:
    return statistics.median(r[field] for r in rows) if rows else math.nan


def report(args: argparse.Namespace, results: dict[str, list[dict[str, float]]], load_at_start: float) -> None:
    for name, rows in results.items():
        print(f"{name} (median of {len(rows)}): charts drawn {median(rows, 'drawn_s'):.2f} s, "
              f"first load {median(rows, 'first_bytes') / 1e3:,.0f} kB; "
              f"per refresh {median(rows, 'bytes_per_tick') / 1e3:,.1f} kB, UI CPU "
              f"{median(rows, 'cpu_per_tick') * 1e3:,.0f} ms")
    shown = "; ".join(
        f"{name}: **{median(rows, 'bytes_per_tick') / 1e3:,.1f} kB** and "
        f"**{median(rows, 'cpu_per_tick') * 1e3:,.0f} ms** UI CPU a refresh "
        f"(first load {median(rows, 'first_bytes') / 1e3:,.0f} kB, every chart drawn "
        f"{median(rows, 'drawn_s'):.2f} s after the address in a new tab)" for name, rows in results.items())
    print_row("Live run's refresh", f"a simulated live {args.ranks}-rank run at {args.steps:,} steps, {args.section} "
              f"section ({', '.join(KEYS)}), {args.window:.0f}-s windows", f"{shown}; medians of {args.rounds}",
              load_at_start)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default=None, help="a commit to measure beside this checkout")
    parser.add_argument("--section", default="Metrics")


def main(argv: list[str] | None = None) -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--write":  # the writer process
        db_url, run_id, ranks, steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        writer(db_url, run_id, ranks, steps)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    load_at_start = load_average()
    report(args, run(args), load_at_start)


if __name__ == "__main__":
    main()
