"""The dashboard in a real Chromium against the real product (`runyard up`: scheduler + UI).

A person opens the New run page, fills the form, presses Start, lands on the Run page and
watches a 2-rank run on CPU train to SUCCEEDED with live charts (the Metrics section), then opens
each rank's log (Logs) and the run's config (Config): each section is drawn only
when chosen. Then the run opens again from the Runs page. A bad
value is refused on the form, naming the field, and nothing is queued.

    pytest -m browser tests/browser        (needs Debian's chromium and pip's playwright)

Streamlit is a websocket app: the tests wait for elements, never for network idle. A
screenshot of the finished Run page is saved in the test's tmp_path and its path printed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser
# The tests share one `runyard up` and read their own runs by id (tests/browser/conftest.py).
SHARES_ONE_RUNYARD_UP = True

RUN_TIMEOUT_MS = 120_000
PAGE_TIMEOUT_MS = 60_000


def expect(target: Any) -> Any:
    from playwright.sync_api import expect as pw_expect  # noqa: PLC0415 - optional: the browser fixture says how to install Playwright

    return pw_expect(target)


def open_page(page: Any, url: str, heading: str) -> None:
    """Go to ``url`` and wait until the page's title ``heading`` is shown.

    On the first visit to a server, Streamlit (streamlit/streamlit#8860, #9992) shows a "Page
    not found" dialog over the right page when the URL is not the default page; close it as a
    person would.
    """
    page.goto(url)
    expect(page.get_by_role("heading", name=heading, level=1)).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    not_found = page.get_by_role("dialog").filter(has_text="Page not found")
    if not_found.count():
        page.keyboard.press("Escape")
        expect(not_found).to_have_count(0)


# Settled: Streamlit's script (and fragment) run is over (stApp's data-test-script-state, what
# Streamlit's own end-to-end tests wait on), no element is stale or a loading skeleton, the fonts
# are loaded and every visible chart has drawn; and all of that held for 300 ms (a fragment that
# reruns at once, or a chart that redraws, restarts the count).
SETTLED_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  const main = document.querySelector('[data-testid="stMain"]');
  const drawn = (chart) => [...chart.querySelectorAll('canvas, svg')].some(e => e.getBoundingClientRect().width > 0);
  const ok = !!app && !!main && app.dataset.testScriptState === 'notRunning' && document.fonts.status === 'loaded'
    && !main.querySelector('[data-stale="true"], [data-testid="stSkeleton"]')
    && [...main.querySelectorAll('[data-testid="stVegaLiteChart"]')].filter(c => c.checkVisibility()).every(drawn);
  if (!ok) { window.__runyardSettledSince = undefined; return false; }
  window.__runyardSettledSince = window.__runyardSettledSince ?? performance.now();
  return performance.now() - window.__runyardSettledSince >= 300;
}"""


def wait_settled(page: Any) -> None:
    """Wait until the page is drawn and idle (:data:`SETTLED_JS`), instead of a fixed sleep."""
    page.wait_for_function(SETTLED_JS, polling=100, timeout=PAGE_TIMEOUT_MS)


def fill_number(page: Any, label: str, value: str) -> None:
    """Type into a form's number input; Tab (not Enter, which would submit the form) commits it."""
    box = page.get_by_label(label, exact=True)
    box.fill(value)
    box.press("Tab")


def start_button(page: Any) -> Any:
    return page.get_by_role("button", name=re.compile(r"\bStart$"))


def toggle(page: Any, label: str) -> None:
    """Switch on the st.toggle labelled ``label`` (its input is hidden: click the label)."""
    page.get_by_test_id("stCheckbox").filter(has_text=label).locator("label").click()
    expect(page.get_by_role("switch", name=label)).to_be_checked()


def show_section(page: Any, name: str) -> None:
    """Choose a section of the Run page (the segmented control under the header)."""
    choice = page.get_by_role("radiogroup", name="Section").get_by_role("radio", name=name, exact=True)
    choice.click()
    expect(choice).to_have_attribute("aria-checked", "true", timeout=PAGE_TIMEOUT_MS)


def chart_titles(page: Any) -> list[str]:
    """The titles drawn in the Vega charts on the page (in DOM order: column by column)."""
    titles = page.locator("[data-testid='stVegaLiteChart'] .role-title-text text")
    return [text.strip() for text in titles.all_text_contents()]


def test_new_run_from_the_form_trains_to_succeeded_with_charts(page: Any, runyard_up: Any, tmp_path: Path) -> None:
    open_page(page, f"{runyard_up.url}/new", "New run")
    page.get_by_label("Name", exact=True).fill("browser-digits")
    # exact: every field has a help button, labelled "Help for <label>"
    expect(page.get_by_label("Ranks per node (nproc_per_node)", exact=True)).to_have_value("2")
    fill_number(page, "Max steps", "300")
    start_button(page).click()

    # Start opens the new run's page. Its first drawing in a fresh UI process imports the chart
    # libraries, which takes a while on a loaded 2-core machine: wait for what the person sees.
    header = page.get_by_role("heading", level=2).filter(has_text=re.compile(r"#\d+ browser-digits"))
    expect(header).to_be_visible(timeout=RUN_TIMEOUT_MS)
    found = re.search(r"#(\d+) browser-digits", header.inner_text())
    assert found, header.inner_text()
    run_id = int(found.group(1))
    expect(page).to_have_url(re.compile(rf"/run\?run={run_id}$"), timeout=PAGE_TIMEOUT_MS)

    # The live panel refreshes every 2 s: QUEUED -> STARTING -> RUNNING -> SUCCEEDED.
    expect(header).to_contain_text("SUCCEEDED", timeout=RUN_TIMEOUT_MS)
    expect(page.get_by_text("step 300 / 300")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    # Visible only and as a list (one element): a fragment redraw can leave the replaced one for a moment.
    accuracy = page.get_by_test_id("stMetric").filter(has_text="Eval accuracy").filter(visible=True)
    expect(accuracy.get_by_test_id("stMetricValue")).to_have_text([re.compile(r"^\d{1,3}(\.\d)?%$")])  # a share
    # The page a Start lands on shows the curves: the loss and the headline metric, side by side,
    # in the first screen of a 1280x800 window, without scrolling.
    page.set_viewport_size({"width": 1280, "height": 800})
    for title in ("Loss", "Eval accuracy"):
        chart = page.get_by_test_id("stVegaLiteChart").filter(
            has=page.locator(".role-title-text text", has_text=re.compile(f"^{title}$"))).filter(visible=True)
        expect(chart).to_have_count(1, timeout=PAGE_TIMEOUT_MS)
        box = chart.bounding_box()
        assert box is not None and box["y"] + box["height"] * 0.75 <= 800, (title, box)  # three quarters at least
    page.set_viewport_size({"width": 1400, "height": 1000})
    show_section(page, "Metrics")

    # Charts: one per metric, loss first, drawn by vega-embed (SVG or canvas).
    charts = page.locator("[data-testid='stVegaLiteChart']")
    expect(charts.first).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(charts.first.locator("canvas, svg").first).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    # at least two charts drawn (waited for: the second arrives after the first)
    expect(page.locator(".vega-embed canvas, .vega-embed svg.marks").nth(1)).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    # Vega draws each chart once it is sent: wait for the last of them before reading the titles.
    expect(page.locator("[data-testid='stVegaLiteChart'] .role-title-text text").filter(
        has_text=re.compile(r"^Throughput$"))).to_have_count(1, timeout=PAGE_TIMEOUT_MS)
    titles = chart_titles(page)  # the metric registry's labels (samples_per_s is Throughput)
    assert titles[0] == "Loss", titles  # first chart, top left
    assert {"Eval accuracy", "Throughput"} <= set(titles), titles

    # The log tails and the config are drawn on demand: one section each.
    show_section(page, "Logs")
    logs = page.get_by_test_id("stSelectbox").filter(has_text="Log")  # one log at a time: rank 0's first
    expect(page.locator(".runyard-log").filter(has_text="rank0 INFO").first).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    # Click once the section is drawn and idle, as a person clicks what they see: a click that
    # lands while the section is being redrawn opened nothing (CI 19, on a slow machine).
    wait_settled(page)
    logs.click()
    for name in ("rank 0", "rank 1", "launcher"):
        expect(page.get_by_role("option", name=name, exact=True)).to_be_visible()
    page.keyboard.press("Escape")
    show_section(page, "Config")
    config = page.get_by_test_id("stJson")
    expect(config).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(config).to_contain_text("browser-digits")
    expect(config).to_contain_text("max_steps")

    shot = tmp_path / "run-page.png"
    page.set_viewport_size({"width": 1400, "height": 2000})  # Streamlit scrolls inside its own pane
    page.screenshot(path=str(shot))
    print(f"\nscreenshot of the finished Run page: {shot}")

    runs = runyard_up.cli("ls")
    assert [(r["id"], r["name"], r["status"], r["step"]) for r in runs] == [
        (run_id, "browser-digits", "SUCCEEDED", 300)]

    # The Runs page opens a run in the same tab when its row is selected (the row-marker
    # checkbox: the grid is a canvas, so the click is by position: first column, first row) and
    # "Open run" pressed (a selection alone no longer opens it: rows are selected to compare too).
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.get_by_test_id("stTopNav").get_by_role("link", name="Runs").click()
    # Streamlit leaves the Run page's elements (a table in an expander among them) until the Runs
    # page has drawn: wait for its own button, then for them to go, before looking for the table.
    expect(page.get_by_role("button", name="Open run")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_test_id("stExpanderDetails")).to_have_count(0, timeout=PAGE_TIMEOUT_MS)
    table = page.get_by_test_id("stDataFrame")
    expect(table).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_role("heading", name="Runs", level=1)).to_be_visible()
    table.click(position={"x": 17, "y": 53})
    page.get_by_role("button", name=f"Open run #{run_id}").click()
    # On its Overview, not on the Config section this run was left on (Streamlit keeps a
    # URL-bound widget's value across pages: CI once saw "/run?run=1&section=Config" here).
    page.wait_for_url(re.compile(rf"/run\?run={run_id}$"), timeout=PAGE_TIMEOUT_MS)
    expect(header).to_contain_text("SUCCEEDED", timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_role("radiogroup", name="Section").get_by_role("radio", name="Overview", exact=True)
           ).to_have_attribute("aria-checked", "true")
    show_section(page, "Metrics")
    expect(page.locator("[data-testid='stVegaLiteChart']").first).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    # Back on the Runs page, the old selection does not send the person to the run again.
    page.get_by_test_id("stTopNav").get_by_role("link", name="Runs").click()
    expect(page.get_by_role("button", name="Open run")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_test_id("stExpanderDetails")).to_have_count(0, timeout=PAGE_TIMEOUT_MS)
    expect(table).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    page.wait_for_timeout(3_000)  # more than one refresh of the table (every 2 s)
    assert "/run?" not in page.url, page.url
    expect(page.get_by_role("heading", name="Runs", level=1)).to_be_visible()


def test_bad_learning_rate_is_refused_and_nothing_is_queued(page: Any, runyard_up: Any) -> None:
    before = {r["id"] for r in runyard_up.cli("ls")}
    open_page(page, f"{runyard_up.url}/new", "New run")
    fill_number(page, "Learning rate", "-1")
    start_button(page).click()

    # Under the field, and in the summary above Start.
    errors = page.get_by_test_id("stAlertContentError").filter(has_text="train.lr")
    expect(errors).to_have_count(2, timeout=PAGE_TIMEOUT_MS)
    expect(errors.first).to_contain_text("greater than 0")
    expect(errors.last).to_contain_text("Not started: 1 problem(s)")
    assert page.url.endswith("/new")

    open_page(page, f"{runyard_up.url}/", "Runs")
    assert {r["id"] for r in runyard_up.cli("ls")} == before  # the runs of the module's earlier tests, and no other


def test_a_browser_without_the_token_gets_the_login_help_then_the_printed_url_logs_it_in(
        browser: Any, runyard_up: Any) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        stranger = context.new_page()
        response = stranger.goto(f"{runyard_up.url}/new")
        assert response is not None and response.status == 401
        expect(stranger.get_by_role("heading", name="Log in with your token")).to_be_visible()
        expect(stranger.get_by_text("runyard token")).to_be_visible()
        assert not context.cookies()
        wrong = stranger.goto(f"{runyard_up.url}/?token=not-the-token")
        assert wrong is not None and wrong.status == 403
        stranger.goto(runyard_up.login_url.replace("/?", "/new?"))
        assert stranger.url == f"{runyard_up.url}/new"  # logged in, and the token left the address bar
        expect(stranger.get_by_role("heading", name="New run", level=1)).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    finally:
        context.close()
