"""Many runs and many metrics in Chromium (issue 56, item 10): the Compare page of 10 runs x 20
metrics, all 20 chosen, and the Run page of a run with 200 metric names, for this checkout and any
other tree side by side.

    .venv/bin/python bench/bench_many_metrics.py [--tree /tmp/before] [--pages compare[,run]] [--repeats 5]

``--tree`` is another runyard checkout (``git worktree add /tmp/before <commit>``, or
``git archive <commit> | tar -x -C /tmp/before``): its `runyard ui` is started on the same data
folder beside this checkout's, and the trees take turns. The data folder is seeded once and
cached under /tmp (bench/seed.py's seed_run: rank 0's writer path, rollups included): ``--runs``
finished runs of ``--ranks`` ranks x ``--steps`` steps, each logging the same 20 metrics
(:data:`COMPARE_KEYS`), and one run of 200 metric names in four prefixed sections
(``train/``, ``val/``, ``sys/``, ``opt/``).

Each repetition opens the page in a fresh browser context (nothing cached: a new Streamlit
session) and times ``page.goto`` until the first chart is drawn (a Vega ``svg.marks`` or canvas
in a ``stVegaLiteChart``) and until the page is idle (its script not running, every chart on it
drawn, nothing stale or a skeleton: what a person waits for before the page answers at once;
"never" when not within ``--idle-timeout``).
On Compare it then presses the X axis's "wall time" (a click while the page settles is what froze
it) and times it until the page is idle again with the first chart on a wall-time axis.
``--pages run`` measures the Run page's Metrics section as well; its BENCHMARKS.md row is
bench/bench_run_metrics.py's, which also times the click back to the Overview.

Prints every time and the medians per tree, and ends with its BENCHMARKS.md rows
(bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.bench_render import (  # noqa: E402 - needs ROOT on sys.path
    FIRST_CHART_DRAWN,
    free_port,
    fresh_context,
    launch_chromium,
    session_cookies,
    start_ui,
)
from bench.benchmarks_row import load_average, print_row  # noqa: E402 - needs ROOT on sys.path
from bench.seed import seed_run  # noqa: E402 - needs ROOT on sys.path
from db.engine import upgrade  # noqa: E402 - needs ROOT on sys.path

CACHE = Path("/tmp/runyard-bench-many-metrics")
COMPARE_KEYS = ("loss", "eval_loss", "eval_accuracy", "lr", "grad_norm", "tokens_per_s", "train/ppl", "train/acc",
                "val/loss", "val/acc", "val/ppl", "sys/step_s", "sys/data_s", "opt/update_norm", "opt/weight_norm",
                "opt/clip_frac", "opt/momentum", "train/entropy", "train/kl", "val/f1")
RUN_KEYS = tuple(f"{group}/m{i:03d}" for group in ("train", "val", "sys", "opt") for i in range(50))
# Idle: the script has ended, every chart shown is drawn, nothing is stale or a skeleton.
IDLE = """() => {
    const app = document.querySelector("[data-testid='stApp']");
    const main = document.querySelector("[data-testid='stMain']");
    if (!app || !main || app.getAttribute("data-test-script-state") !== "notRunning") return false;
    if (main.querySelector("[data-stale='true'], [data-testid='stSkeleton']")) return false;
    const charts = [...main.querySelectorAll("[data-testid='stVegaLiteChart']")].filter(c => c.checkVisibility());
    return charts.length > 0 && charts.every(c => c.querySelector('svg.marks, canvas'));
}"""
WALL_AXIS = """() => {
    const chart = document.querySelector("[data-testid='stMain'] [data-testid='stVegaLiteChart']");
    return !!chart && [...chart.querySelectorAll('.role-axis-title text')].some(t => t.textContent === 'wall time');
}"""
TIMEOUT_MS = 300_000


def seeded_home(runs: int, ranks: int, steps: int, run_steps: int) -> tuple[Path, list[int], int]:
    """The data folder (cached by its parameters): the compared runs' ids and the 200-name run's."""
    home = CACHE / f"{runs}x{ranks}x{steps}-{run_steps}"
    marker = home / "run_ids"
    if marker.is_file():
        *compared, many = (int(i) for i in marker.read_text().split(","))
        return home, compared, many
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    db_url = f"sqlite:///{home / 'runyard.db'}"
    upgrade(db_url)
    t0 = time.monotonic()
    print(f"seeding {runs} runs x {len(COMPARE_KEYS)} metrics x {ranks} ranks x {steps:,} steps and a run of "
          f"{len(RUN_KEYS)} metrics into {home} (cached for later runs)...", flush=True)
    compared = [seed_run(db_url, ranks=ranks, steps=steps, keys=COMPARE_KEYS, name=f"cmp-{i}") for i in range(runs)]
    many = seed_run(db_url, ranks=ranks, steps=run_steps, keys=RUN_KEYS, name="many-metrics")
    print(f"seeded in {time.monotonic() - t0:.0f} s", flush=True)
    marker.write_text(",".join(map(str, [*compared, many])))
    return home, compared, many


def open_page(browser: Any, cookies: list[dict[str, Any]], url: str, click_wall: bool,
              idle_timeout_s: float) -> tuple[float, float, float]:
    """In a fresh context: seconds from goto to the first chart drawn and to idle (infinite when
    not idle within ``idle_timeout_s``: the page still drawing); with ``click_wall``, then seconds
    from pressing the X axis's "wall time" to idle on that axis."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: PLC0415 - optional, as in main

    context = fresh_context(browser, cookies)
    page = context.new_page()
    try:
        t0 = time.monotonic()
        page.goto(url)
        page.wait_for_function(FIRST_CHART_DRAWN, timeout=TIMEOUT_MS, polling="raf")
        first = time.monotonic() - t0
        try:
            page.wait_for_function(IDLE, timeout=max(1.0, idle_timeout_s - first) * 1000, polling="raf")
            idle = time.monotonic() - t0
        except PlaywrightTimeout:
            return first, math.inf, math.inf
        if page.locator("[data-testid='stException']").count():
            raise RuntimeError(page.locator("[data-testid='stException']").first.inner_text())
        clicked = 0.0
        if click_wall:
            t0 = time.monotonic()
            page.get_by_role("radiogroup", name="X axis").get_by_role("radio", name="wall time").click()
            page.wait_for_function(f"() => ({WALL_AXIS})() && ({IDLE})()", timeout=TIMEOUT_MS, polling="raf")
            clicked = time.monotonic() - t0
        return first, idle, clicked
    finally:
        context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another runyard checkout")
    parser.add_argument("--pages", default="compare", help="compare, run or both")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--run-steps", type=int, default=1000, help="steps of the run of 200 metric names")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--idle-timeout", type=float, default=300.0,
                        help="seconds an open may take to idle before it counts as never (> this)")
    args = parser.parse_args()
    load_at_start = load_average()
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - optional: Playwright, only to render

    home, compared, many = seeded_home(args.runs, args.ranks, args.steps, args.run_steps)
    urls = {"compare": f"/compare?runs={','.join(map(str, compared))}&metrics={','.join(COMPARE_KEYS)}",
            "run": f"/run?run={many}&section=Metrics"}
    pages = [p for p in args.pages.split(",") if p]
    trees = [ROOT, *(t.resolve() for t in args.tree)]
    uis = {tree: start_ui(home, free_port(), tree) for tree in trees}
    times: dict[tuple[Path, str], list[tuple[float, float, float]]] = {(t, p): [] for t in trees for p in pages}
    try:
        with sync_playwright() as pw:
            browser = launch_chromium(pw)
            cookies = {t: session_cookies(browser, uis[t][1]) for t in trees}
            bases = {t: uis[t][1].split("/?token=")[0] for t in trees}
            for t in trees:  # the warm-up: each server's first imports and page compile
                for p in pages:
                    open_page(browser, cookies[t], bases[t] + urls[p], False, args.idle_timeout)
            for i in range(args.repeats):
                for t in trees if i % 2 == 0 else trees[::-1]:
                    for p in pages:
                        got = open_page(browser, cookies[t], bases[t] + urls[p], p == "compare", args.idle_timeout)
                        times[(t, p)].append(got)
                        print(f"  {i + 1}: {shown(t)}, {p}: first chart {got[0]:.2f} s, idle {seconds(got[1])}"
                              + (f", wall time -> idle {seconds(got[2])}" if p == "compare" else ""), flush=True)
            browser.close()
    finally:
        for proc, _ in uis.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    print(f"medians of {args.repeats}, load average {os.getloadavg()[0]:.2f}:")
    for p in pages:
        for t in trees:
            print(f"  {p}, {shown(t)}: {summary(times[(t, p)], p)}")
    what = {"compare": f"Compare of {args.runs} runs x {len(COMPARE_KEYS)} metrics (all chosen; {args.ranks} ranks x "
                       f"{args.steps:,} steps each)",
            "run": f"the Run page's Metrics section of a run with {len(RUN_KEYS)} metric names ({args.ranks} ranks x "
                   f"{args.run_steps:,} steps)"}
    for p in pages:
        result = "; ".join(f"{shown(t)}: {summary(times[(t, p)], p, bold=t == ROOT)}" for t in trees)
        print_row("Many metrics in the browser" if p == "run" else "Many runs and metrics in the browser",
                  f"{what[p]} in a new tab in Chromium: goto -> first chart, -> idle"
                  + (", then the X axis's wall time -> idle again" if p == "compare" else ""),
                  f"{result}; medians of {args.repeats}", load_at_start)


def seconds(value: float, mark: str = "") -> str:
    """A time as the rows show it; not idle within ``--idle-timeout``: more than it."""
    return f"{mark}{value:.2f} s{mark}" if math.isfinite(value) else f"{mark}over --idle-timeout{mark}"


def shown(tree: Path) -> str:
    return "this checkout" if tree == ROOT else f"the tree at {tree}"


def summary(got: list[tuple[float, float, float]], page: str, bold: bool = False) -> str:
    mark = "**" if bold else ""
    first, idle, clicked = (statistics.median(g[i] for g in got) for i in range(3))
    text = f"first chart {seconds(first, mark)}, idle {seconds(idle, mark)}"
    return text + (f", wall time -> idle {seconds(clicked)}" if page == "compare" else "")


if __name__ == "__main__":
    main()
