"""The Run page's Metrics section for a run with 200 metric names (issue 56 item 10, MLflow #24012).

    .venv/bin/python bench/bench_run_metrics.py [--repeats 3] [--before /tmp/runyard-before]

Seeds one finished 2-rank run of 1,000 steps logging 200 metric names in 10 prefixes
(``block0/m0`` … ``block9/m19``: 400k points through bench/seed.py's seed_run) into a data folder
under /tmp, starts `runyard ui` on it and, in Debian's Chromium at 1280x800, opens the run's
Metrics section in a fresh browser context each time (after one warm-up): seconds from
``page.goto`` to the first chart drawn, to idle (the page's script done and every chart on it
drawn), and then from a click on the section picker's Overview to its first chart (the page answers
a click); a mark not reached within ``--cap`` seconds is printed as ``inf``. With ``--before TREE``
(a checkout of an earlier commit, e.g. ``git archive 1542773 | tar -x -C /tmp/runyard-before``),
the same on that tree's UI (its own data folder at its own schema), for a before/after. Prints each
time, the medians, and the BENCHMARKS.md row.
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
    ALL_CHARTS_DRAWN,
    FIRST_CHART_DRAWN,
    MARK_CHARTS,
    NEW_CHART_DRAWN,
    free_port,
    launch_chromium,
    session_cookies,
    start_ui,
)
from bench.benchmarks_row import load_average, print_row  # noqa: E402 - needs ROOT on sys.path
from bench.seed import seed_run  # noqa: E402 - needs ROOT on sys.path
from db.engine import upgrade  # noqa: E402 - needs ROOT on sys.path

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # pragma: no cover - the benchmark says how to install it when run
    PlaywrightTimeout = TimeoutError  # type: ignore[misc,assignment]

CACHE = Path("/tmp/runyard-bench-run-metrics")
KEYS = tuple(f"block{b}/m{i}" for b in range(10) for i in range(20))
RANKS, STEPS = 2, 1_000
VIEWPORT = {"width": 1280, "height": 800}


def seeded_home(label: str, revision: str) -> tuple[Path, int]:
    """A data folder at schema ``revision`` with the 200-name run, made afresh."""
    home = CACHE / label
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    db_url = f"sqlite:///{home / 'runyard.db'}"
    upgrade(db_url, revision)
    run_id = seed_run(db_url, ranks=RANKS, steps=STEPS, keys=KEYS, name="bench-200-names")
    return home, run_id


def _within(page: Any, check: str, cap_s: float, t0: float, polling: Any = "raf") -> float:
    """Seconds from ``t0`` until ``check`` holds, or ``inf`` when it still does not after ``cap_s``."""
    try:
        page.wait_for_function(check, timeout=cap_s * 1000, polling=polling)
    except PlaywrightTimeout:
        return math.inf
    return time.monotonic() - t0


def open_metrics(browser: Any, cookies: list[dict[str, Any]], base: str, run_id: int,
                 cap_s: float) -> tuple[float, float, float]:
    """(first chart, idle, Overview's first chart after the click) in seconds, in a fresh context;
    ``inf`` for what did not happen within ``cap_s``."""
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies(cookies)
    page = context.new_page()
    try:
        t0 = time.monotonic()
        page.goto(f"{base}/run?run={run_id}&section=Metrics")
        first = _within(page, FIRST_CHART_DRAWN, cap_s, t0)
        idle = _within(page, ALL_CHARTS_DRAWN, cap_s, t0, polling=100)
        if page.locator("[data-testid='stException']").count():
            raise RuntimeError(page.locator("[data-testid='stException']").first.inner_text())
        charts = page.locator("[data-testid='stVegaLiteChart']").count()
        page.evaluate(MARK_CHARTS)
        t1 = time.monotonic()
        page.get_by_role("radiogroup", name="Section").get_by_role("radio", name="Overview", exact=True).click(
            timeout=cap_s * 1000)
        click = _within(page, NEW_CHART_DRAWN, cap_s, t1)
        print(f"    first chart {first:.2f} s, idle {idle:.2f} s ({charts} charts), click -> Overview {click:.2f} s",
              flush=True)
        return first, idle, click
    finally:
        context.close()


def measure(browser: Any, tree: Path, label: str, revision: str, repeats: int,
            cap_s: float) -> list[tuple[float, float, float]]:
    home, run_id = seeded_home(label, revision)
    proc, login = start_ui(home, free_port(), tree)
    base = login.split("/?")[0]
    try:
        cookies = session_cookies(browser, login)
        print(f"  {label} ({tree}): warm-up", flush=True)
        open_metrics(browser, cookies, base, run_id, cap_s)
        return [open_metrics(browser, cookies, base, run_id, cap_s) for _ in range(repeats)]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def medians(times: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    first, idle, click = zip(*times, strict=True)
    return statistics.median(first), statistics.median(idle), statistics.median(click)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, help="an earlier checkout to measure too (schema r003)")
    parser.add_argument("--before-revision", default="r003")
    parser.add_argument("--cap", type=float, default=120.0, help="seconds to wait for each mark (then: inf)")
    args = parser.parse_args()
    load = load_average()
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - a benchmark's own dependency

    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            results = {}
            if args.before:
                results["before"] = medians(measure(browser, args.before, "before", args.before_revision, args.repeats,
                                                    args.cap))
            results["after"] = medians(measure(browser, ROOT, "after", "head", args.repeats, args.cap))
        finally:
            browser.close()
    for label, (first, idle, click) in results.items():
        print(f"{label}: median first chart {first:.2f} s, idle {idle:.2f} s, click -> Overview {click:.2f} s")
    first, idle, click = results["after"]
    was = results.get("before")
    before = f" (before: {was[0]:.2f} / {was[1]:.2f} / {was[2]:.2f} s)" if was else ""
    print_row("Run page, 200 metric names", f"2 ranks x 1k steps x 200 names, Metrics at 1280x800, median of "
              f"{args.repeats} new tabs: first chart / idle / a click to the Overview's chart",
              f"{first:.2f} / {idle:.2f} / {click:.2f} s{before}", load)


if __name__ == "__main__":
    main()
