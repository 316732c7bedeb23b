"""Nothing is cut at the widths people use (issue 20, item 6): every page at 1440, 1280 and 800
px wide, screenshotted, and inspected in the page itself for text that does not fit: an element
whose text is wider than its box where the box clips it ("Smoothin…", "$…"), and a word broken
across two lines ("checkp/oint"). Canvas and SVG (the charts and the tables' grid) draw their own
text and are not inspected here.

The screenshots land in the test's folder; with RUNYARD_SCREENSHOTS=DIR they are also kept there
(docs/UI.md's tour is taken this way).

    pytest -m browser tests/browser/test_widths_browser.py
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.browser.test_resume_browser import submit, wait_for
from tests.browser.test_ui_browser import PAGE_TIMEOUT_MS, expect, wait_settled

pytestmark = pytest.mark.browser
WIDTHS = (1440, 1280, 800)

# For each element of the main area and the top bar that holds text itself: clipped text (its
# content wider than its box, where the box or its style hides the rest), and words split over
# two lines. Returns one line per problem: what, the element's test id, its text.
FIND_CUT_TEXT = """
() => {
  const problems = [];
  const roots = [...document.querySelectorAll('[data-testid="stMain"], [data-testid="stHeader"]')];
  const skip = ['svg', 'canvas', '[data-testid="stDataFrame"]', '.vega-embed', '[role="tooltip"]',
                '[data-testid="stTooltipContent"]'].join(', ');
  const label = (el) => {
    const owner = el.closest('[data-testid]');
    return owner ? owner.getAttribute('data-testid') : el.tagName;
  };
  for (const root of roots) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const el = node.parentElement;
      if (!node.textContent.trim() || !el || el.closest(skip)) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      const text = range.getBoundingClientRect();
      if (!text.width || getComputedStyle(el).visibility === 'hidden') continue;
      // Clipped: an ancestor that hides its overflow (an ellipsis is painted over laid-out text)
      // is narrower than the text.
      let clipped = false;
      for (let a = el; a && a !== root.parentElement; a = a.parentElement) {
        const ox = getComputedStyle(a).overflowX;
        if (ox !== 'hidden' && ox !== 'clip') continue;
        const box = a.getBoundingClientRect();
        if (box.width && (text.right > box.right + 1 || text.left < box.left - 1)) { clipped = true; break; }
      }
      if (clipped) {
        problems.push(`clipped [${label(el)}] ${node.textContent.trim().slice(0, 80)}`);
        continue;
      }
      const re = /[^\\s\\-\u2010\u2013\u2014/]{2,}/g;
      let m;
      while ((m = re.exec(node.textContent)) !== null) {
        const word = document.createRange();
        word.setStart(node, m.index);
        word.setEnd(node, m.index + m[0].length);
        const tops = new Set([...word.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
        if (tops.size > 1) problems.push(`word broken [${label(el)}] ${m[0].slice(0, 60)}`);
      }
    }
  }
  return problems;
}
"""


def cut_text(page: Any) -> list[str]:
    return list(page.evaluate(FIND_CUT_TEXT))


@pytest.fixture
def trained(runyard_up: Any) -> int:
    """A short run that SUCCEEDED with checkpoints, metrics and attempts to show."""
    run_id = submit(runyard_up, "train.max_steps=200", "checkpoint.every_steps=50", "name=widths")
    wait_for(runyard_up, run_id, lambda d: d["status"] == "SUCCEEDED", "SUCCEEDED")
    return run_id


def test_no_text_is_cut_at_1440_1280_and_800_px(runyard_up: Any, trained: int, page: Any, tmp_path: Path) -> None:
    pages = {
        "runs": ("/", page.get_by_role("heading", name="Runs", level=1)),
        "new-run": ("/new", page.get_by_role("heading", name="New run", level=1)),
        "run": (f"/run?run={trained}", page.get_by_role("heading", level=2).filter(has_text="SUCCEEDED")),
        # The Metrics section's controls (issue 29 item 10: cut at 800 px).
        "run-metrics": (f"/run?run={trained}&section=Metrics", page.get_by_role("radio", name="per rank", exact=True)),
        "compare": (f"/compare?runs={trained}", page.get_by_role("heading", name="Compare", level=1)),
        "settings": ("/settings", page.get_by_role("heading", name="Settings", level=1)),
    }
    keep = os.environ.get("RUNYARD_SCREENSHOTS")
    found: dict[str, list[str]] = {}
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 800})
        for name, (path, ready) in pages.items():
            page.goto(f"{runyard_up.url}{path}")
            expect(ready).to_be_visible(timeout=PAGE_TIMEOUT_MS)
            not_found = page.get_by_role("dialog").filter(has_text="Page not found")  # streamlit#9992
            if not_found.count():
                page.keyboard.press("Escape")
            wait_settled(page)  # the charts drawn, no rerun under way
            shot = tmp_path / f"{name}-{width}.png"
            page.screenshot(path=str(shot), full_page=True)
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(shot, Path(keep) / shot.name)
            problems = cut_text(page)
            if problems:
                found[f"{name} at {width} px"] = problems
    assert not found, "text cut:\n" + "\n".join(f"{where}: {p}" for where, ps in found.items() for p in ps)
