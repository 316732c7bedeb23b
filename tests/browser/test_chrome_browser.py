"""The dashboard is runyard's, not a Streamlit demo's: the product's name and version at the
top, no Deploy button, no Stop/Running widget, no "Record screen" or "Made with Streamlit"
menu, and not a single request leaves 127.0.0.1 (a GPU workstation may be offline, and a page
that fetches from elsewhere tells elsewhere it is open).

    pytest -m browser tests/browser/test_chrome_browser.py
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from orchestrator.format import runyard_version
from tests.browser.test_ui_browser import PAGE_TIMEOUT_MS, expect, open_page

pytestmark = pytest.mark.browser


def test_the_pages_show_runyard_and_fetch_nothing_from_outside_the_machine(page: Any, runyard_up: Any) -> None:
    hosts: list[str] = []
    page.on("request", lambda request: hosts.append(urlsplit(request.url).hostname or request.url))
    for path, heading in [("/", "Runs"), ("/new", "New run"), ("/settings", "Settings"), ("/compare", "Compare")]:
        open_page(page, f"{runyard_up.url}{path}", heading)
        # The name and version head the top bar: a logo the page draws from an SVG it serves itself.
        logo = page.get_by_test_id("stHeaderLogo")
        expect(logo).to_be_visible(timeout=PAGE_TIMEOUT_MS)
        drawn = page.evaluate("async (src) => await (await fetch(src)).text()", logo.get_attribute("src"))
        assert ">runyard<" in drawn and f">{runyard_version()}<" in drawn, drawn[:300]
        expect(page.get_by_test_id("stTopNav")).to_contain_text("Runs")
        page.wait_for_timeout(2_500)  # a live refresh or two: the Stop/Running widget would show now
        for chrome in ("stAppDeployButton", "stStatusWidget", "stMainMenu", "stToolbarActions"):
            assert page.get_by_test_id(chrome).filter(visible=True).count() == 0, (path, chrome)
        for words in ("Deploy", "Record a screencast", "Made with Streamlit", "Stop"):
            assert page.get_by_text(words, exact=True).filter(visible=True).count() == 0, (path, words)
    assert hosts and set(hosts) == {"127.0.0.1"}, sorted(set(hosts))


def test_the_runs_page_answers_at_slash_runs_too(page: Any, runyard_up: Any) -> None:
    """The Runs page is the default page, which Streamlit serves at "/" only: "/runs", the
    address a person types after seeing "Runs" in the top bar, answered "Page not found"."""
    open_page(page, f"{runyard_up.url}/runs", "Runs")
    assert urlsplit(page.url).path == "/"
    assert page.get_by_text("Page not found").count() == 0
