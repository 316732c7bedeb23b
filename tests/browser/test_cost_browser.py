"""The Run page's costs in a real Chromium against the real product (`runyard up`): "Your cost" and
"Cloud reference" as two named headline tiles with a line under them; before a tariff is set, no
number of yours and a link to Settings that opens the "Your cost" section; once set, a number of
its own.

    pytest -m browser tests/browser/test_cost_browser.py
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from db.engine import make_engine, make_sessionmaker
from db.models import Attempt
from db.requests import create_run
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings_file import write_values
from tests.browser.test_resume_browser import PAGE_TIMEOUT_MS, expect, open_run_page

pytestmark = pytest.mark.browser


def seed_run(home: Path) -> int:
    """A SUCCEEDED run of one hour on 2 of the machine's 2 CPU slots at $1.80/h, written through the
    product's own writers."""
    engine = make_engine(f"sqlite:///{home / 'runyard.db'}")
    end = time.time() - 30
    try:
        with make_sessionmaker(engine)() as s:
            run = create_run(s, RunConfig.model_validate({"name": "priced"}), home / "runs",
                             Price(usd_per_hour=1.8, unit="2/2 of a CPU node @ $1.8/h"))
            s.flush()
            for status in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED):
                assert transition(s, run.id, status, "seeded by the cost browser test")
            run.started_at, run.ended_at = end - 3600, end
            s.add(Attempt(run_id=run.id, number=1, status="SUCCEEDED", dir=str(Path(run.run_dir) / "attempts" / "1"),
                          started_at=end - 3600, ended_at=end, first_step_at=end - 3590, progress_at=end,
                          last_step=10, resume_step=0))
            s.commit()
            return run.id
    finally:
        engine.dispose()


def test_the_cost_panel_names_both_lines_and_links_to_settings(page: Any, runyard_up: Any) -> None:
    run_id = seed_run(runyard_up.home)
    open_run_page(page, runyard_up.url, run_id, "priced")
    panel = page.locator(".st-key-headline")  # the headline numbers and the cost line under them
    expect(panel.get_by_text("Your cost", exact=True)).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(panel.get_by_text("Cloud reference", exact=True)).to_be_visible()
    expect(panel.get_by_text("$1.80", exact=True)).to_be_visible()  # an hour at the list price
    expect(panel.get_by_text("No electricity tariff set, so no cost of yours.")).to_be_visible()
    # The owner's hardware: $8,760 over 1 year of 4,380 busy hours is $2 a machine-hour, all of it held.
    write_values(runyard_up.home, {("cost", "electricity_usd_per_kwh"): 0.30, ("cost", "hardware_usd_per_gpu"): 8760.0,
                                   ("cost", "hardware_life_years"): 1.0})
    panel.get_by_role("link", name="Set your tariff in Settings").click()
    expect(page.get_by_role("heading", name="Your cost")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_text("hardware $2.00 per GPU-hour")).to_be_visible()
    open_run_page(page, runyard_up.url, run_id, "priced")
    expect(panel.get_by_text("$2.00", exact=True)).to_be_visible(timeout=PAGE_TIMEOUT_MS)  # yours: hardware alone
    expect(panel.get_by_text("$1.80", exact=True)).to_be_visible()  # the cloud reference, apart
    expect(panel.get_by_text("energy not measured", exact=False).first).to_be_visible()
    expect(panel.get_by_role("link", name="Set your tariff in Settings")).to_have_count(0)
