"""The Run page's charts in a real Chromium on a big run: 8 ranks x 100k steps (800k points).

A finished 8-rank run of 100k steps and a small 2-rank one are written into the data folder of
a real `runyard up` the way rank 0's writer would (bench/seed.py: db.metricstore.write_points,
with one NaN on rank 3 half-way); then a person
opens the big run: every chart is drawn, with no exception box, in a sane time. They switch to
the rank mean with its band, the wall-time x axis, a log y axis and EMA smoothing (its slider in a
popover), each redrawn without an error, and overlay the two runs on the Compare page.

    pytest -m browser tests/browser/test_charts_browser.py
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

pytestmark = pytest.mark.browser

PAGE_TIMEOUT_MS = 60_000
RENDER_BUDGET_S = 30.0  # generous: a loaded 2-core test machine; bench/bench_render.py measures
BIG = {"name": "big-8x100k", "ranks": 8, "steps": 100_000}
SMALL = {"name": "small-2x3k", "ranks": 2, "steps": 3_000}
ALL_CHARTS_DRAWN = """() => {
    const charts = [...document.querySelectorAll("[data-testid='stVegaLiteChart']")];
    return charts.length > 0 && charts.every(c => c.querySelector('svg.marks, canvas'));
}"""


def expect(target: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(target)


def seed(runyard: Any, spec: dict[str, Any]) -> int:
    """A finished run in runyard's database, written through rank 0's write path (bench/seed.py)."""
    from bench.seed import seed_run

    return seed_run(f"sqlite:///{runyard.home / 'runyard.db'}", ranks=spec["ranks"], steps=spec["steps"],
                    keys=("loss",), name=spec["name"], runs_dir=runyard.home / "runs")


def wait_drawn(page: Any) -> float:
    """Seconds until every chart on the page is drawn; fails on an exception box."""
    t0 = time.monotonic()
    page.wait_for_function(ALL_CHARTS_DRAWN, timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_test_id("stException")).to_have_count(0)
    return time.monotonic() - t0


def axis_title(page: Any, text: str) -> Any:
    return page.locator("[data-testid='stVegaLiteChart'] .role-axis-title text").filter(has_text=text)


def test_big_run_charts_render_and_switch_options_then_compare(page: Any, runyard_up: Any) -> None:
    big = seed(runyard_up, BIG)
    small = seed(runyard_up, SMALL)

    t0 = time.monotonic()
    page.goto(f"{runyard_up.url}/run?run={big}&section=Metrics")  # the Run page's charts
    header = page.get_by_role("heading", level=2).filter(has_text=f"#{big}")
    expect(header).to_contain_text("SUCCEEDED", timeout=PAGE_TIMEOUT_MS)
    wait_drawn(page)
    first_render_s = time.monotonic() - t0
    print(f"\nRun page of {BIG['ranks']} x {BIG['steps']:,} points: all charts drawn in {first_render_s:.2f} s")
    assert first_render_s < RENDER_BUDGET_S
    assert "loss" in [t.strip() for t in page.locator("[data-testid='stVegaLiteChart'] .role-title-text text")
                      .all_text_contents()]
    expect(page.get_by_text("NaN × 1")).to_be_visible()  # rank 3's NaN, as a badge
    legend = page.locator("[data-testid='stVegaLiteChart'] .role-legend-label text").all_text_contents()
    assert [str(r) for r in range(8)] == legend[:8]  # one line per rank

    def settle() -> None:
        page.wait_for_timeout(500)  # the fragment reruns; let the redraw start
        wait_drawn(page)

    def choose(role: str, name: str) -> None:
        page.get_by_role(role, name=name, exact=True).first.click()
        settle()

    choose("radio", "mean + band")
    legend = page.locator("[data-testid='stVegaLiteChart'] .role-legend-label text")
    expect(legend.filter(has_text="0")).to_have_count(0)
    choose("radio", "wall time")
    expect(axis_title(page, "wall time").first).to_be_visible()
    page.get_by_test_id("stCheckbox").filter(has_text="Log y").locator("label").click()  # the switch's input is hidden
    settle()
    expect(page.get_by_role("switch", name="Log y")).to_be_checked()
    page.get_by_role("button", name=re.compile(r"Smoothing \(EMA\)")).click()  # the slider sits in a popover
    slider = page.get_by_role("slider").first
    slider.focus()
    slider.press("End")  # the strongest smoothing
    settle()
    expect(page.get_by_test_id("stSlider").first).to_contain_text("0.99")
    choose("radio", "relative time")
    expect(axis_title(page, "time since start").first).to_be_visible()

    page.goto(f"{runyard_up.url}/compare")
    expect(page.get_by_role("heading", name="Compare runs", level=1)).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    not_found = page.get_by_role("dialog").filter(has_text="Page not found")
    if not_found.count():
        page.keyboard.press("Escape")
    wait_drawn(page)
    labels = page.locator("[data-testid='stVegaLiteChart'] .role-legend-label text").all_text_contents()
    assert sorted(labels) == sorted([f"#{big} {BIG['name']} (SUCCEEDED)", f"#{small} {SMALL['name']} (SUCCEEDED)"])
