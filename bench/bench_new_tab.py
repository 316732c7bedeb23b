"""A run's page opened in a new tab, for two or more source trees side by side.

    .venv/bin/python bench/bench_new_tab.py --tree /tmp/before [--tree ...] [--opens 10] [--section Metrics]

Starts `runyard ui` from this checkout and from each ``--tree`` (``git worktree add /tmp/before
<commit>``) on bench_render.py's seeded run (8 ranks x 10,000 steps, cached under /tmp), then
opens the run's page (``/run?run=N&section=...``) in new tabs, the trees taking turns: in a fresh
browser context (nothing cached: a first visit) and in one context per tree that has opened the
page before (its scripts cached: a bookmark in a browser a person uses). Times ``page.goto`` to the
first chart drawn, and reads each UI's CPU (its process and children) over its opens. Prints every
open and the medians, and ends with its BENCHMARKS.md row (bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.bench_render import (  # noqa: E402 - needs ROOT on sys.path
    FIRST_CHART_DRAWN,
    free_port,
    fresh_context,
    launch_chromium,
    seeded_home,
    session_cookies,
    start_ui,
)
from bench.benchmarks_row import load_average, print_row  # noqa: E402 - needs ROOT on sys.path


def cpu_s(proc: subprocess.Popen) -> float:
    """CPU seconds of ``proc`` and its children so far."""
    root = psutil.Process(proc.pid)
    return sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another runyard checkout")
    parser.add_argument("--opens", type=int, default=10, help="new tabs per tree and kind of context")
    parser.add_argument("--section", default="Metrics")
    args = parser.parse_args()
    load_at_start = load_average()
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - optional: Playwright, only to render

    home, run_id = seeded_home(8, 10_000, ("loss",))
    trees = [ROOT, *(t.resolve() for t in args.tree)]
    uis = {tree: start_ui(home, free_port(), tree) for tree in trees}
    times: dict[tuple[Path, str], list[float]] = {(t, kind): [] for t in trees for kind in ("fresh", "cached")}
    cpu = dict.fromkeys(trees, 0.0)
    try:
        with sync_playwright() as pw:
            browser = launch_chromium(pw)
            cookies = {t: session_cookies(browser, url) for t, (_, url) in uis.items()}
            page_url = {t: f"{url.split('/?token=')[0]}/run?run={run_id}&section={args.section}"
                        for t, (_, url) in uis.items()}
            cached = {t: fresh_context(browser, cookies[t]) for t in trees}
            for t in trees:  # the warm-up: the server's first page compile, the cached context's scripts
                page = cached[t].new_page()
                page.goto(page_url[t])
                page.wait_for_function(FIRST_CHART_DRAWN, timeout=120_000)
                page.close()
            for i in range(args.opens):
                for t in trees if i % 2 == 0 else trees[::-1]:
                    for kind in ("fresh", "cached"):
                        context = fresh_context(browser, cookies[t]) if kind == "fresh" else cached[t]
                        page = context.new_page()
                        before = cpu_s(uis[t][0])
                        t0 = time.monotonic()
                        page.goto(page_url[t])
                        page.wait_for_function(FIRST_CHART_DRAWN, timeout=120_000, polling="raf")
                        times[(t, kind)].append(time.monotonic() - t0)
                        page.wait_for_timeout(300)  # the rest of the page's script, in the CPU read
                        cpu[t] += cpu_s(uis[t][0]) - before
                        page.close()
                        if kind == "fresh":
                            context.close()
                    print(f"  {i + 1}: {t}: first chart {times[(t, 'fresh')][-1]:.2f} s fresh, "
                          f"{times[(t, 'cached')][-1]:.2f} s cached", flush=True)
            browser.close()
    finally:
        for proc, _ in uis.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    print(f"the {args.section} section of a finished 8-rank 10k-step run in a new tab, goto -> first chart, "
          f"median of {args.opens}:")
    for t in trees:
        fresh, warm = times[(t, "fresh")], times[(t, "cached")]
        print(f"  {t}: fresh context {statistics.median(fresh):.2f} s (min {min(fresh):.2f}, max {max(fresh):.2f}); "
              f"scripts cached {statistics.median(warm):.2f} s (min {min(warm):.2f}, max {max(warm):.2f}); "
              f"the UI's CPU per open {cpu[t] / (2 * args.opens):.3f} s")
    print(f"  load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sides = []
    for t in trees:
        fresh, warm = statistics.median(times[(t, "fresh")]), statistics.median(times[(t, "cached")])
        shown = "this checkout" if t == ROOT else f"the tree at {t}"
        sides.append(f"{shown}: fresh context **{fresh:.2f} s**, scripts cached **{warm:.2f} s**, the UI's CPU "
                     f"{cpu[t] / (2 * args.opens):.3f} s an open")
    print_row("Run page in a new tab, trees side by side", f"a finished run's {args.section} section opened in "
              "new tabs (goto -> first chart) and the UI's CPU, this checkout against another tree, taking turns",
              "; ".join(sides) + f"; medians of {args.opens}", load_at_start)


if __name__ == "__main__":
    main()
