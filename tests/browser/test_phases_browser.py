"""A run that has not reached its first step says what it does (issue 20, item 14): the Run page
shows "Launching" while torchrun starts the ranks and they join, then "Setting up" while they load
the data, then the charts. The data load is made slow (RUNYARD_FAULT_SETUP_DELAY_S, a test hook:
the real one takes a fraction of a second) so that a refresh every 2 s catches each phase.
Then the New run page's estimate before Start (item 13) takes that run's pace.

    pytest -m browser tests/browser/test_phases_browser.py
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser.test_resume_browser import submit
from tests.browser.test_ui_browser import (
    PAGE_TIMEOUT_MS,
    RUN_TIMEOUT_MS,
    expect,
    fill_number,
    open_page,
    show_section,
)

pytestmark = pytest.mark.browser
SETUP_DELAY_S = 12


@pytest.fixture
def slow_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listed before runyard_up: the scheduler, and so the ranks, inherit these."""
    monkeypatch.setenv("RUNYARD_FAULTS", "1")
    monkeypatch.setenv("RUNYARD_FAULT_SETUP_DELAY_S", str(SETUP_DELAY_S))


def test_the_run_page_names_each_start_up_phase_then_new_run_estimates_from_that_run(
        slow_setup: None, runyard_up: Any, page: Any) -> None:
    run_id = submit(runyard_up, "train.max_steps=200", "name=phases")
    page.goto(f"{runyard_up.url}/run?run={run_id}")
    seen = page.get_by_text(re.compile(r"^(Launching|Setting up): "))
    # Launching lasts as long as importing torch and the rendezvous take; then the slow set-up.
    expect(page.get_by_text(re.compile(r"^Setting up: loading the data and building the model")).first).to_be_visible(
        timeout=RUN_TIMEOUT_MS)
    header = page.get_by_role("heading", level=2).filter(has_text=f"#{run_id} phases")
    expect(header).to_contain_text("STARTING")
    expect(header).to_contain_text("SUCCEEDED", timeout=RUN_TIMEOUT_MS)
    # Once it trained, no phase is shown any more, and the charts are there.
    expect(seen).to_have_count(0, timeout=PAGE_TIMEOUT_MS)
    show_section(page, "Metrics")
    expect(page.locator("[data-testid='stVegaLiteChart']").first).to_be_visible(timeout=PAGE_TIMEOUT_MS)

    # Before the next Start, the New run page estimates time and cost from that run's pace.
    open_page(page, f"{runyard_up.url}/new", "New run")
    estimate = page.get_by_test_id("stAlert").filter(has_text="Estimate")
    pace = re.compile(rf"About .+ and \$[\d.]+: 3,000 steps at [\d.]+ steps/s as run #{run_id} phases trained")
    expect(estimate).to_contain_text(pace, timeout=PAGE_TIMEOUT_MS)
    before = estimate.all_inner_texts()  # no strict-mode read while a fragment redraws
    fill_number(page, "Max steps", "30000")
    page.get_by_role("button", name="Update estimate").click()
    expect(estimate).to_contain_text("30,000 steps", timeout=PAGE_TIMEOUT_MS)
    assert estimate.all_inner_texts() != before
    expect(page.get_by_role("heading", name="New run", level=1)).to_be_visible()  # not started
    assert len(runyard_up.cli("ls")) == 1
