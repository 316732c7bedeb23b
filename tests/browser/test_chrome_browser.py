"""The dashboard is runyard's, not a Streamlit demo's: the product's name and version at the
top, no Deploy button, no Stop/Running widget, no "Record screen" or "Made with Streamlit"
menu, and not a single request leaves 127.0.0.1 (a GPU workstation may be offline, and a page
that fetches from elsewhere tells elsewhere it is open). Text that runs write (a run's name, a
script's exception) is shown as typed: Markdown, images and HTML in it are neither drawn nor
fetched, on the Runs, Run and Compare pages.

    pytest -m browser tests/browser/test_chrome_browser.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from orchestrator.format import runyard_version
from tests.browser.test_resume_browser import REPO, open_run_page, wait_for
from tests.browser.test_ui_browser import PAGE_TIMEOUT_MS, expect, open_page, show_section

pytestmark = pytest.mark.browser
# The tests share one `runyard up` and read their own runs by id (tests/browser/conftest.py).
SHARES_ONE_RUNYARD_UP = True


def request_host(url: str) -> str:
    """The host a request went to; a ``blob:`` address (what the page's components v2 load their inline
    code as: made in the page, fetched from nowhere) counts as its page's origin's."""
    return urlsplit(url.removeprefix("blob:")).hostname or url


def test_the_pages_show_runyard_and_fetch_nothing_from_outside_the_machine(page: Any, runyard_up: Any) -> None:
    hosts: list[str] = []
    page.on("request", lambda request: hosts.append(request_host(request.url)))
    # Each page finds its server at once: Streamlit's client, left to itself, asks under the page's
    # own path first (/new/_stcore/health, a 404) and tries "/" a pause later (app/server/gate.py).
    calls: list[str] = []
    page.on("request", lambda request: calls.append(urlsplit(request.url).path) if "_stcore" in request.url else None)
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
    assert "/_stcore/health" in calls and all(c.startswith("/_stcore/") for c in calls), sorted(set(calls))


def test_the_runs_page_answers_at_slash_runs_too(page: Any, runyard_up: Any) -> None:
    """The Runs page is the default page, which Streamlit serves at "/" only: "/runs", the
    address a person types after seeing "Runs" in the top bar, answered "Page not found"."""
    open_page(page, f"{runyard_up.url}/runs", "Runs")
    assert urlsplit(page.url).path == "/"
    assert page.get_by_text("Page not found").count() == 0


# Markdown that would fetch an image, an HTML image and bold text: from an address outside the
# machine (TEST-NET-2, which nothing answers), so that drawing any of it shows as a request. Run
# names are letters, digits, '.', '_' and '-' only; a script's exception and its metric names are
# whatever the script says.
BEACON = "198.51.100.7"
MARKUP = f"**loud** ![md](http://{BEACON}/md.png) <img src='http://{BEACON}/html.png'> <b>tag</b>"
METRIC = "**loss** <b>x</b>"
SCRIPT = f"""import runyard
run = runyard.init()
for step in (1, 2, 3):
    run.log(step, **{{{METRIC!r}: 1.0 / step}})
run.close()  # the metrics written, as after any failure
raise RuntimeError({MARKUP!r})
"""


def test_a_failing_scripts_markup_is_shown_as_typed_and_fetches_nothing(page: Any, runyard_up: Any) -> None:
    hosts: list[str] = []
    page.on("request", lambda request: hosts.append(request_host(request.url)))
    script = runyard_up.home / "fails.py"  # the data folder: under the allowed roots
    script.write_text(SCRIPT)
    config = runyard_up.home / "fails.toml"
    config.write_text(f'name = "markup"\n[workload]\nkind = "script"\nscript = {json.dumps(str(script))}\n')
    env = {**os.environ, "RUNYARD_HOME": str(runyard_up.home)}
    env.pop("RUNYARD_DB_URL", None)
    out = subprocess.run([sys.executable, "-m", "orchestrator", "submit", str(config)], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    run_id = int(out.stdout.strip().splitlines()[-1])
    detail = wait_for(runyard_up, run_id, lambda d: d["status"] == "FAILED", "the script to fail")
    assert MARKUP in detail["attempts"][0]["exception"], detail["attempts"][0]

    def drew_nothing(where: str) -> None:
        assert page.locator(f"img[src*='{BEACON}']").count() == 0, where
        drawn = page.locator("b, strong").filter(has_text=re.compile(r"^(tag|loud|loss|x)$"))
        assert drawn.count() == 0, (where, [drawn.nth(i).locator("xpath=../..").evaluate("e => e.outerHTML")[:400]
                                            for i in range(drawn.count())])

    open_run_page(page, runyard_up.url, run_id, "markup")
    expect(page.get_by_text("RuntimeError: " + MARKUP).first).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    drew_nothing("Run")
    # The rank's log (issue 29, item 9): searched, the matches marked, the markup as text; every
    # log downloads as one zip.
    show_section(page, "Logs")
    search = page.get_by_role("textbox", name="Search this log")
    search.fill("loud")
    search.press("Enter")
    marks = page.locator(".runyard-log mark")
    expect(marks.first).to_have_text("loud", timeout=PAGE_TIMEOUT_MS)
    shown = "\n".join(page.locator(".runyard-log").all_inner_texts())
    assert "RuntimeError: " + MARKUP in shown, shown[-2000:]
    drew_nothing("Logs")
    page.get_by_role("button", name="Download all logs (zip)").click()
    with page.expect_download() as download:
        page.get_by_role("button", name=re.compile(f"Save run-{run_id}-logs.zip")).click()
    names = zipfile.ZipFile(download.value.path()).namelist()
    assert {"attempt-1/rank-0/stderr.log", "attempt-1/rank-1/stderr.log", "attempt-1/launcher.log"} <= set(names)
    open_page(page, f"{runyard_up.url}/compare?runs={run_id}&metrics={quote(METRIC)}", "Compare")
    # The summary: the run's row under the metric's column (the energy and cost table names the run too).
    summary = page.locator("table").filter(has_text=f"{METRIC} final")
    expect(summary).to_contain_text(f"#{run_id} markup", timeout=PAGE_TIMEOUT_MS)
    drew_nothing("Compare")
    assert hosts and set(hosts) == {"127.0.0.1"}, sorted(set(hosts))
