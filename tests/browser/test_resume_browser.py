"""Resume from the Run page in a real Chromium against the real product (`runyard up`).

A person opens a finished run, opens Resume ▾ in the header, picks an older checkpoint and
confirms: the run goes back through QUEUED / STARTING / RUNNING to SUCCEEDED, its second attempt
starts after that checkpoint's step, and (the digits workload being deterministic on CPU for a
given seed) ends with exactly the parameters of the first attempt. While a run is active Resume
is not offered; Cancel asks for a confirmation (one click only opens it), and once the run is
cancelled Resume is offered.

    pytest -m browser tests/browser        (needs Debian's chromium and pip's playwright)

Runs are queued through the CLI with the server's RUNYARD_HOME; the page is only read and
clicked, never reloaded (its live panel refreshes itself every 2 s). A screenshot of the
resumed run's page is saved in the test's tmp_path and its path printed.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import databases
from tests.browser.test_ui_browser import show_section
from tests.conftest import training_processes

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits.toml"
RUN_TIMEOUT_S = 120.0
RUN_TIMEOUT_MS = 120_000
PAGE_TIMEOUT_MS = 60_000
PIN = "pin"
NOT_TERMINAL = re.compile(r"\b(QUEUED|STARTING|RUNNING)\b")
TERMINAL = re.compile(r"\b(SUCCEEDED|FAILED|CANCELLED)\b")


def expect(target: Any) -> Any:
    from playwright.sync_api import expect as pw_expect  # noqa: PLC0415 - optional: the browser fixture says how to install Playwright

    return pw_expect(target)


def submit(runyard: Any, *overrides: str) -> int:
    """`python -m orchestrator submit examples/digits.toml --set ...` against the server's home."""
    env = {**os.environ, "RUNYARD_HOME": str(runyard.home)}
    env.pop("RUNYARD_DB_URL", None)
    argv = [sys.executable, "-m", "orchestrator", "submit", str(DIGITS)]
    for override in overrides:
        argv += ["--set", override]
    out = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"submit failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return int(out.stdout.strip().splitlines()[-1])


def wait_for(runyard: Any, run_id: int, ok: Any, what: str, timeout_s: float = RUN_TIMEOUT_S) -> dict:
    """Poll the run's detail (`runyard show RUN --json`'s answer, read in-process) until
    ``ok(detail)``; fail early on an unexpected end."""
    deadline = time.monotonic() + timeout_s
    ended_at: float | None = None
    detail: dict = {}
    while time.monotonic() < deadline:
        detail = databases.run_detail(f"sqlite:///{runyard.home / 'runyard.db'}", run_id)
        if ok(detail):
            return detail
        if detail["status"] in {"FAILED", "CANCELLED", "SUCCEEDED"}:
            # A terminal status that is not what we wait for will not change by itself (a few
            # seconds of grace for rows written just after the status).
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at > 5.0:
                pytest.fail(f"run {run_id} ended {detail['status']} ({detail['status_reason']}) "
                            f"while waiting for {what}")
        time.sleep(0.5)
    pytest.fail(f"run {run_id} not {what} in {timeout_s:.0f} s: {detail.get('status')} "
                f"({detail.get('status_reason')}), step {detail.get('step')}")


def open_run_page(page: Any, url: str, run_id: int, name: str) -> Any:
    """Open the Run page of ``run_id`` and return its header (the live panel's h2).

    On the first visit to a server, Streamlit (streamlit/streamlit#8860, #9992) may show a "Page
    not found" dialog over the right page when the URL is not the default page; close it.
    """
    page.goto(f"{url}/run?run={run_id}")
    header = page.get_by_role("heading", level=2).filter(has_text=f"#{run_id} {name}")
    expect(header).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    not_found = page.get_by_role("dialog").filter(has_text="Page not found")
    if not_found.count():
        page.keyboard.press("Escape")
        expect(not_found).to_have_count(0)
    return header


def header_action(page: Any, name: str) -> Any:
    """A button of the Run page's header actions (Resume, Fork…, Pause, Cancel…)."""
    return page.locator("[class*='st-key-actions-']").get_by_role("button").filter(has_text=name)


def checkpoint_rows(page: Any) -> Any:
    """The Checkpoints section's rows: the column blocks that hold a pin switch."""
    return page.get_by_test_id("stHorizontalBlock").filter(has=page.get_by_role("switch", name=PIN))


def row_cells(row: Any) -> list[str]:
    return [text.strip() for text in row.get_by_test_id("stColumn").all_inner_texts()]


def attempts_table(page: Any) -> Any:
    """The Attempts table. st.dataframe draws on a canvas; glide-data-grid keeps an accessible
    copy of the visible cells as a <table role="grid"> inside it."""
    return page.get_by_test_id("stDataFrame").filter(
        has=page.locator("th", has_text=re.compile(r"^attempt$"))
    ).locator("table[role='grid']")


def sql(home: Path, query: str, *args: Any) -> list[tuple]:
    con = sqlite3.connect(home / "runyard.db")
    try:
        return con.execute(query, args).fetchall()
    finally:
        con.close()


def digest_at(detail: dict, step: int, attempt: int) -> str:
    found = [c for c in detail["checkpoints"] if c["step"] == step and c["attempt"] == attempt]
    assert len(found) == 1, (step, attempt, detail["checkpoints"])
    return found[0]["params_digest"]


def test_resume_a_finished_run_from_an_older_checkpoint(page: Any, runyard_up: Any, tmp_path: Path) -> None:
    run_id = submit(runyard_up, "checkpoint.every_steps=100", "checkpoint.keep_last=0", "name=resume-me")
    first = wait_for(
        runyard_up, run_id,
        lambda d: d["status"] == "SUCCEEDED" and [c["step"] for c in d["checkpoints"]] == [100, 200, 300],
        "SUCCEEDED with checkpoints at 100, 200, 300",
    )
    assert [a["number"] for a in first["attempts"]] == [1]
    assert all(c["verified"] and not c["deleted"] for c in first["checkpoints"]), first["checkpoints"]
    digest_300 = digest_at(first, 300, attempt=1)
    digest_200 = digest_at(first, 200, attempt=1)

    header = open_run_page(page, runyard_up.url, run_id, "resume-me")
    expect(header).to_contain_text("SUCCEEDED")
    show_section(page, "Checkpoints")
    rows = checkpoint_rows(page)
    expect(rows).to_have_count(3, timeout=PAGE_TIMEOUT_MS)
    # Newest first; the first column is the step, the second the attempt that wrote it.
    assert [row_cells(rows.nth(i))[:2] for i in range(3)] == [["300", "1"], ["200", "1"], ["100", "1"]]
    row_100 = rows.filter(has=page.get_by_text("100", exact=True))
    expect(row_100).to_have_count(1)
    assert row_cells(row_100)[0] == "100"
    assert row_cells(row_100)[5] == "yes"  # verified
    # Resume ▾ in the header: the newest checkpoint preselected; step 100 chosen, then confirmed.
    header_action(page, "Resume").click()
    popover = page.get_by_test_id("stPopoverBody")
    choose(popover, "From checkpoint", "step 100 · attempt 1")
    expect(popover).to_contain_text("kept but marked superseded")
    assert runyard_up.cli("show", str(run_id))["status"] == "SUCCEEDED"  # choosing acted on nothing
    popover.get_by_role("button", name=re.compile("Resume from step 100")).click()

    # The live panel follows the run through a new attempt to the end.
    expect(header).to_contain_text(NOT_TERMINAL, timeout=30_000)
    expect(header).to_contain_text(TERMINAL, timeout=RUN_TIMEOUT_MS)
    if not any("SUCCEEDED" in text for text in header.all_inner_texts()):  # no strict-mode read mid-redraw
        d = runyard_up.cli("show", str(run_id))
        pytest.fail(f"the resumed run ended {d['status']}: {d['status_reason']} (logs: {d['attempts'][-1]['dir']})")
    expect(page.get_by_text("step 300 / 300")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    # Visible only, and as a list: while a fragment redraws Streamlit can keep the replaced element in
    # the page (hidden, or for a moment still shown beside the new one). The list form waits until
    # exactly one visible "Attempts" reads 2 instead of failing on the moment two exist.
    attempts_metric = page.get_by_test_id("stMetric").filter(has_text="Attempts").filter(visible=True)
    expect(attempts_metric.get_by_test_id("stMetricValue")).to_have_text(["2"], timeout=PAGE_TIMEOUT_MS)
    show_section(page, "Attempts")
    table = attempts_table(page)
    expect(table.locator("thead th").nth(0)).to_have_text("attempt", timeout=PAGE_TIMEOUT_MS)
    expect(table.locator("thead th").nth(1)).to_have_text("status")
    expect(table.locator("tbody tr")).to_have_count(2, timeout=PAGE_TIMEOUT_MS)
    expect(table.locator("tbody td[aria-colindex='1']")).to_have_text(["1", "2"])
    expect(table.locator("tbody td[aria-colindex='2']")).to_have_text(["SUCCEEDED", "SUCCEEDED"],
                                                                      timeout=PAGE_TIMEOUT_MS)

    # The CLI sees the same: a second attempt, started from step 100, finished.
    second = wait_for(runyard_up, run_id, lambda d: d["status"] == "SUCCEEDED", "SUCCEEDED again")
    assert [a["number"] for a in second["attempts"]] == [1, 2]
    assert [a["status"] for a in second["attempts"]] == ["SUCCEEDED", "SUCCEEDED"]
    assert second["attempts"][1]["resume_step"] == 100
    assert second["step"] == 300

    # Attempt 2 logged nothing at or before step 100 (log_every = 10: first loss at step 110)...
    (min_step,) = sql(runyard_up.home,
                      "SELECT MIN(step) FROM metrics WHERE run_id = ? AND attempt = 2 AND key = 'loss'", run_id)[0]
    assert min_step is not None and min_step > 100, min_step
    assert min_step == 110
    # ... and repeated attempt 1's losses bit for bit from there on.
    losses = {
        attempt: dict(((rank, step), value) for rank, step, value in sql(
            runyard_up.home,
            "SELECT rank, step, value FROM metrics WHERE run_id = ? AND attempt = ? AND key = 'loss' AND step > 100",
            run_id, attempt))
        for attempt in (1, 2)
    }
    assert losses[2] and losses[2] == losses[1]

    # The new checkpoints at 200 and 300 hold exactly the parameters of the first attempt's.
    assert digest_at(second, 200, attempt=2) == digest_200
    assert digest_at(second, 300, attempt=2) == digest_300

    # The page lists them too, newest first: attempt 2's 300 and 200 beside attempt 1's, now
    # marked superseded, then the 100 it resumed from.
    show_section(page, "Checkpoints")
    expect(rows).to_have_count(5, timeout=PAGE_TIMEOUT_MS)
    assert [row_cells(rows.nth(i))[:2] for i in range(5)] == [
        ["300", "2"], ["300 (superseded)", "1"], ["200", "2"], ["200 (superseded)", "1"], ["100", "1"],
    ]

    shot = tmp_path / "resumed-run-page.png"
    page.set_viewport_size({"width": 1400, "height": 2400})  # Streamlit scrolls inside its own pane
    header.scroll_into_view_if_needed()
    page.screenshot(path=str(shot))
    print(f"\nscreenshot of the resumed Run page: {shot}")


def choose(scope: Any, label: str, option: str) -> None:
    """Pick ``option`` in the select box labelled ``label`` (a list drawn outside ``scope``)."""
    box = scope.get_by_test_id("stSelectbox").filter(has_text=label)
    box.click()
    scope.page.get_by_role("option", name=option).click()  # what it chose: checked by what follows


def test_cancel_asks_for_a_confirmation_and_resume_is_offered_once_the_run_is_cancelled(
        paced_runs: float, page: Any, runyard_up: Any) -> None:
    run_id = submit(runyard_up, "train.max_steps=100000", "checkpoint.every_steps=20", "name=long-run")
    wait_for(
        runyard_up, run_id,
        lambda d: d["status"] == "RUNNING" and any(c["verified"] and not c["deleted"] for c in d["checkpoints"]),
        "RUNNING with a checkpoint", timeout_s=90.0,
    )

    header = open_run_page(page, runyard_up.url, run_id, "long-run")
    expect(header).to_contain_text("RUNNING")
    expect(header_action(page, "Pause")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(header_action(page, "Fork…")).to_be_visible()
    expect(header_action(page, "Resume")).to_have_count(0)  # not while it runs

    # One click on Cancel only opens its confirmation; the run goes on.
    header_action(page, "Cancel").click()
    popover = page.get_by_test_id("stPopoverBody")
    expect(popover).to_contain_text(f"Cancel run #{run_id}?")
    page.wait_for_timeout(3_000)  # more than one refresh of the page
    assert runyard_up.cli("show", str(run_id))["status"] == "RUNNING"
    expect(header).to_contain_text("RUNNING")
    popover.get_by_role("button", name=re.compile("Cancel run$")).click()
    wait_for(runyard_up, run_id, lambda d: d["status"] == "CANCELLED", "CANCELLED", timeout_s=60.0)

    # No reload: the live panel refreshes by itself; Resume is offered, Cancel and Pause are gone.
    expect(header).to_contain_text("CANCELLED", timeout=30_000)
    expect(header_action(page, "Resume")).to_be_visible(timeout=30_000)
    expect(header_action(page, "Cancel")).to_have_count(0)
    expect(header_action(page, "Pause")).to_have_count(0)

    # Nothing of the run is left running.
    deadline = time.monotonic() + 30
    while training_processes(runyard_up.home) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert training_processes(runyard_up.home) == []
