"""The Runs list as a workspace and a run's metadata, in a real Chromium against `runyard up`
(issue 29, items 4, 7 and 8): what a person sees.

One test, one server, the fewest steps (this tier is slow): a long run and a second one; the
person tags the first on its page (Edit…), pauses it and watches the badge go PAUSING, then
PAUSED, never CANCELLING; then on the Runs list sees the tag and the list narrowed by a search;
`runyard show` reports the same tag.

    pytest -m browser tests/browser/test_workspace_browser.py
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.browser.test_resume_browser import (
    PAGE_TIMEOUT_MS,
    expect,
    header_action,
    open_run_page,
    submit,
    wait_for,
)
from tests.browser.test_runs_grid_browser import grid_rows_as_data

pytestmark = pytest.mark.browser


def grid_rows(page: Any) -> Any:
    """The Runs table's rows: st.dataframe draws on a canvas; glide-data-grid keeps an accessible
    copy of the visible cells as a <table role="grid"> inside it."""
    return page.get_by_test_id("stDataFrame").locator("table[role='grid'] tbody tr")


@pytest.fixture
def slow_saves(paced_runs: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Listed before runyard_up: each checkpoint is published 2 s late, so a pause (which waits
    for its last checkpoint) lasts long enough for the page to show PAUSING. Without it the pause
    of this small model once ended within the page's own rerun after the click, and CI saw
    RUNNING, then PAUSED."""
    monkeypatch.setenv("RUNYARD_FAULT_SAVE_DELAY", "*:2")


def test_tag_pause_and_search_as_a_person_sees_them(slow_saves: None, page: Any, runyard_up: Any) -> None:
    long_run = submit(runyard_up, "train.max_steps=100000", "checkpoint.every_steps=20", "name=alpha")
    submit(runyard_up, "name=beta")  # RUNYARD_CPU_SLOTS=2: waits for alpha's two slots
    wait_for(runyard_up, long_run,
             lambda d: d["status"] == "RUNNING" and any(c["verified"] and not c["deleted"] for c in d["checkpoints"]),
             "RUNNING with a checkpoint", timeout_s=90.0)

    # Edit…: a new tag, saved; shown under the title, and by `runyard show`.
    header = open_run_page(page, runyard_up.url, long_run, "alpha")
    header_action(page, "Edit…").click()
    popover = page.get_by_test_id("stPopoverBody")
    # A comma list as on the New run page: typed, not Entered, and saved (issue 56, item 6).
    popover.get_by_role("textbox", name="Tags").fill("sweep-3")
    popover.get_by_role("button").filter(has_text="Save").click()
    expect(page.get_by_test_id("stMarkdown").filter(has_text=re.compile(r"^sweep-3$"))).to_be_visible(
        timeout=PAGE_TIMEOUT_MS)
    assert runyard_up.cli("show", "alpha")["tags"] == ["sweep-3"]

    # Pause: PAUSING at once, then PAUSED; never CANCELLING (sampled every 0.1 s).
    header_action(page, "Pause").click()
    seen: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (not seen or "PAUSED" not in seen[-1]):
        seen.append(header.inner_text())
        page.wait_for_timeout(100)
    statuses = [m.group(0) for text in seen if (m := re.search(r"\b[A-Z]{6,}\b", text))]
    assert "PAUSING" in statuses and statuses[-1] == "PAUSED", statuses[-20:]
    assert "CANCELLING" not in statuses
    assert statuses.index("PAUSING") < statuses.index("PAUSED")

    # The Runs list: both runs, alpha with its tag; a search for the tag narrows it to alpha.
    page.goto(runyard_up.url)
    rows = grid_rows(page)
    expect(rows).to_have_count(2, timeout=PAGE_TIMEOUT_MS)
    expect(rows.filter(has_text="alpha")).to_have_count(1)
    # Its tags: the grid's own data (the column may lie scrolled out of view to the right).
    assert [r["tags"] for r in grid_rows_as_data(page) if r["name"] == "alpha"] == ["sweep-3"]
    search = page.get_by_test_id("stTextInput").filter(has_text="Search").locator("input")
    search.fill("sweep")
    search.press("Enter")
    expect(rows).to_have_count(1, timeout=PAGE_TIMEOUT_MS)
    expect(rows.first).to_contain_text("alpha")
