"""The Run page a person lives in (issue 20, items 3 and 10), in a real Chromium against the real
product (`runyard up`).

- Live without fade: while a real run trains, the page is sampled every ~200 ms; no element of
  the main area may be faded (Streamlit's stale elements: computed opacity < 1), and no sample
  may show a finished badge beside Cancel or Pause.
- A retry keeps the curves: rank 1 is SIGKILLed at a known step, and while the run waits to
  retry and its second attempt starts, the loss chart stays and "Waiting for the first metrics"
  never comes back; then the Attempts section times that retry phase by phase.
- Fork…: the New run form opens filled with the run's config, one value changed shows up as the
  change against the source run, and Start queues a fork whose config is the source plus that
  change, starting from the chosen checkpoint.

    pytest -m browser tests/browser/test_run_page_browser.py
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.browser.test_resume_browser import (
    PAGE_TIMEOUT_MS,
    RUN_TIMEOUT_MS,
    choose,
    header_action,
    open_run_page,
    sql,
    submit,
    wait_for,
)
from tests.browser.test_ui_browser import expect, fill_number, show_section

pytestmark = pytest.mark.browser
SAMPLE_EVERY_MS = 200
FINISHED = re.compile(r"\b(SUCCEEDED|FAILED|CANCELLED|PAUSED)\b")

# One sample of the page: every Streamlit element and block shown in the main area (each node with
# a data-testid: what Streamlit's stale style fades, to 0.33 after half a second, and what holds
# everything drawn) whose computed opacity is below 1; the header's text, and which actions the
# header offers. What is faded on purpose, always, is left out: a caption's text (0.6), and the
# hover-only controls (a chart's toolbar, a heading's link icon: 0 until hovered). Inside a chart,
# Vega hides overlapping axis labels with opacity 0: the chart's own SVG is not looked into.
# Elements not shown (display: none, as an action's empty slot) cannot look faded. A skeleton (the
# grey pulsing box Streamlit shows while an element drawn for the first time loads its code) is
# counted apart: a placeholder.
SAMPLE_JS = """() => {
  const main = document.querySelector('[data-testid="stMain"]');
  const faded = [];
  const skeletons = [...main.querySelectorAll('[data-testid="stSkeleton"]')].filter(e => e.checkVisibility()).length;
  for (const el of main.querySelectorAll('[data-testid]')) {
    if (!el.checkVisibility() || el.closest('svg') || el.closest('[data-testid="stSkeleton"]')) continue;
    if (el.closest('[data-testid="stElementToolbar"]') || el.closest('h1, h2, h3, h4, h5, h6')) continue;
    const o = parseFloat(getComputedStyle(el).opacity);
    if (o >= 1) continue;
    if (el.dataset.testid === 'stCaptionContainer' && Math.abs(o - 0.6) < 1e-6) continue;
    const inner = el.querySelector('[data-testid]');
    faded.push(`${el.dataset.testid}(${inner ? inner.dataset.testid : ''}) ${o.toFixed(2)} stale=${el.dataset.stale}`);
  }
  const h2 = main.querySelector('h2');
  const actions = main.querySelector("[class*='st-key-actions-']");
  const labels = actions ? [...actions.querySelectorAll("button")].filter(b => b.checkVisibility())
    .map(b => b.innerText) : [];
  return {faded, skeletons, header: h2 ? h2.innerText : '', actions: labels,
          waiting: main.innerText.includes('Waiting for the first metrics'),
          charts: [...main.querySelectorAll('[data-testid="stVegaLiteChart"]')]
            .filter(e => e.checkVisibility()).length};
}"""


def sample(page: Any) -> dict:
    return page.evaluate(SAMPLE_JS)


def offers(s: dict, name: str) -> bool:
    return any(name in label for label in s["actions"])


def test_the_live_run_page_never_fades_and_never_shows_a_finished_badge_beside_cancel(
        paced_runs: float, page: Any, runyard_up: Any) -> None:
    # About 25 s of training (800 paced steps): well over the 60 samples asked for below.
    run_id = submit(runyard_up, "train.max_steps=800", "checkpoint.every_steps=500", "name=live")
    open_run_page(page, runyard_up.url, run_id, "live")
    show_section(page, "Metrics")  # the charts: the section that costs the most to redraw
    samples: list[dict] = []
    deadline = time.monotonic() + 180
    finished_at: float | None = None
    while time.monotonic() < deadline:
        s = sample(page)
        s["t"] = time.monotonic()
        samples.append(s)
        if FINISHED.search(s["header"]):
            finished_at = finished_at or time.monotonic()
            if time.monotonic() - finished_at > 12:  # a few refreshes after the end, too
                break
        page.wait_for_timeout(SAMPLE_EVERY_MS)
    detail = runyard_up.cli("show", str(run_id))
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    training = [s for s in samples if s["charts"] and "RUNNING" in s["header"]]
    # About 200 ms apart; fewer on a loaded machine, where each sample takes longer to read.
    assert len(training) >= 60, f"only {len(training)} samples while the charts trained"
    faded = [(round(s["t"] - samples[0]["t"], 1), s["faded"][:5]) for s in samples if s["faded"]]
    assert not faded, f"{len(faded)} of {len(samples)} samples had faded elements, first: {faded[:5]}"
    mixed = [(s["header"], s["actions"]) for s in samples
             if FINISHED.search(s["header"]) and (offers(s, "Cancel") or offers(s, "Pause"))]
    assert not mixed, f"a finished badge beside Cancel/Pause: {mixed[:3]}"
    # The page did follow the run (the samples are not of a frozen page).
    assert any("RUNNING" in s["header"] and offers(s, "Cancel") and offers(s, "Pause") for s in samples)
    assert "SUCCEEDED" in samples[-1]["header"] and offers(samples[-1], "Resume")
    skeletons = sum(1 for s in samples if s["skeletons"])
    print(f"\n{len(samples)} samples over {samples[-1]['t'] - samples[0]['t']:.0f} s, "
          f"{len(training)} while training with charts: none faded; {skeletons} showed a loading skeleton")


@pytest.fixture
def rank1_killed_at_step_150(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listed before runyard_up: the scheduler, and so the ranks, inherit these."""
    monkeypatch.setenv("RUNYARD_FAULTS", "1")
    monkeypatch.setenv("RUNYARD_FAULT_SIGKILL", "150:1")
    monkeypatch.setenv("RUNYARD_FAULT_STEP_DELAY_S", "0.02")  # about 10 s from step 0 to the kill


def test_a_retry_keeps_the_previous_attempts_curves_while_the_next_attempt_starts(
        rank1_killed_at_step_150: None, runyard_up: Any, page: Any) -> None:
    # The wait before the retry must span several of the live panel's refreshes even under load:
    # with 4 s (RETRYING for 2.8 s, the backoff counted from the failure) a run on three test
    # workers showed no sample of it.
    run_id = submit(runyard_up, "train.max_steps=3000", "checkpoint.every_steps=50", "retry.max_retries=1",
                    "retry.backoff_s=10", "name=retry")
    open_run_page(page, runyard_up.url, run_id, "retry")
    show_section(page, "Metrics")
    charts = page.locator("[data-testid='stVegaLiteChart']")
    expect(charts.first).to_be_visible(timeout=RUN_TIMEOUT_MS)
    samples: list[dict] = []
    deadline = time.monotonic() + 150

    def second_attempt_trained() -> bool:
        rows = sql(runyard_up.home, "SELECT last_step, resume_step FROM attempts WHERE run_id = ? AND number = 2",
                   run_id)
        return bool(rows) and (rows[0][0] or 0) > (rows[0][1] or 0)

    while time.monotonic() < deadline and not second_attempt_trained():
        samples.append(sample(page))
        page.wait_for_timeout(SAMPLE_EVERY_MS)
    assert second_attempt_trained(), "the second attempt did not train in 150 s"
    attempts = sql(runyard_up.home, "SELECT number, cause, resume_step FROM attempts WHERE run_id = ? ORDER BY number",
                   run_id)
    assert attempts[0][:2] == (1, "SIGNAL") and attempts[1][0] == 2 and attempts[1][2] == 100, attempts
    retrying = [s for s in samples if "RETRYING" in s["header"]]
    starting = [s for s in samples if "STARTING" in s["header"]]
    assert retrying and starting, "the samples missed the wait before the retry or its start-up"
    gone = [s["header"] for s in samples if s["charts"] == 0 or s["waiting"]]
    assert not gone, f"the charts went away or 'Waiting for the first metrics' came back: {gone[:3]}"
    # Every chart the first attempt drew stayed (which points they draw is checked in
    # tests/unit/app/views/test_run_charts.py). Counted among the visible charts only, against the last sample
    # before the wait: while a fragment redraws, Streamlit keeps the replaced chart hidden beside
    # the new one: one sample that counted such hidden copies raised the former bar ("as many as
    # the most ever counted") above every other sample, the likely cause of its failures in CI.
    before = samples[samples.index(retrying[0]) - 1]["charts"]
    assert before > 0 and all(s["charts"] >= before for s in retrying + starting), (
        before, [(s["header"], s["charts"]) for s in retrying + starting if s["charts"] < before][:10])
    # The retry timed by phase (issue 32): from the failure to the second attempt's first step,
    # the 10 s backoff (counted from the failure) most of its relaunch.
    show_section(page, "Attempts")
    phases = page.get_by_text(re.compile(
        r"^Attempt 2 recovery from the failure: teardown [\d.]+s · detect [\d.]+s · relaunch ([5-9]|\d\d)\.\ds · "
        r"launch [\d.]+s · import [\d.]+s · rendezvous [\d.]+s · data [\d.]+s · checkpoint [\d.]+s · "
        r"first_step [\d.]+s = [\d.]+s$"))
    expect(phases).to_be_visible(timeout=PAGE_TIMEOUT_MS)


def test_fork_opens_the_new_run_form_filled_with_a_diff_and_start_queues_the_fork(
        page: Any, runyard_up: Any) -> None:
    parent = submit(runyard_up, "train.max_steps=300", "checkpoint.every_steps=100", "checkpoint.keep_last=0",
                    "train.lr=0.002", "name=parent")
    wait_for(runyard_up, parent, lambda d: d["status"] == "SUCCEEDED" and len(d["checkpoints"]) == 3,
             "SUCCEEDED with 3 checkpoints")
    source = runyard_up.cli("show", str(parent))
    step_200 = next(c for c in source["checkpoints"] if c["step"] == 200)

    open_run_page(page, runyard_up.url, parent, "parent")
    header_action(page, "Fork…").click()
    popover = page.get_by_test_id("stPopoverBody")
    choose(popover, "From checkpoint", "step 200 · attempt 1")
    popover.get_by_role("button", name=re.compile("Open in the New run form")).click()

    expect(page.get_by_role("heading", name="New run", level=1)).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(page).to_have_url(re.compile(rf"/new\?fork={parent}&checkpoint={step_200['id']}$"))
    expect(page.get_by_text(f"Fork of run #{parent} parent from its checkpoint at step 200")).to_be_visible()
    # The form holds the source run's values (not the form's defaults).
    expect(page.get_by_label("Name", exact=True)).to_have_value("parent-fork", timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_label("Max steps", exact=True)).to_have_value("300")
    expect(page.get_by_label("Learning rate", exact=True)).to_have_value("0.002")
    expect(page.get_by_label("Ranks per node (nproc_per_node)", exact=True)).to_have_value(
        str(source["config"]["launch"]["nproc_per_node"]))
    changes = page.get_by_test_id("stAlert").filter(has_text="against run #")
    expect(changes).to_contain_text(f"No changes yet against run #{parent} at step 200")

    fill_number(page, "Max steps", "400")
    page.get_by_role("button", name="Update estimate").click()
    expect(changes).to_contain_text(f"Changes against run #{parent} at step 200 (1)", timeout=PAGE_TIMEOUT_MS)
    expect(changes).to_contain_text("train.max_steps: 300 → 400")
    assert len(runyard_up.cli("ls")) == 1  # nothing queued by looking
    page.get_by_role("button", name=re.compile(r"\bStart$")).click()

    header = page.get_by_role("heading", level=2).filter(has_text="parent-fork")
    expect(header).to_be_visible(timeout=RUN_TIMEOUT_MS)
    shown = " ".join(header.all_inner_texts())  # no strict-mode read while a fragment redraws
    found = re.search(r"#(\d+) parent-fork", shown)
    assert found, shown
    fork_id = int(found.group(1))
    forked = wait_for(runyard_up, fork_id, lambda d: d["status"] == "SUCCEEDED", "SUCCEEDED")
    expected = {**source["config"], "name": "parent-fork",
                "train": {**source["config"]["train"], "max_steps": 400}}
    assert forked["config"] == expected
    assert (forked["parent_run_id"], forked["parent_step"]) == (parent, 200)
    assert forked["attempts"][0]["resume_step"] == 200
    assert forked["step"] == 400


def test_the_run_page_opened_before_the_first_run_comes_alive_by_itself(page: Any, runyard_up: Any) -> None:
    # Seen in CI: the page read the run list a moment before the submit, said "No runs yet" and
    # kept saying it.
    page.goto(f"{runyard_up.url}/run")
    expect(page.get_by_text("No runs yet")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    run_id = submit(runyard_up, "train.max_steps=20", "name=later")
    header = page.get_by_role("heading", level=2).filter(has_text=f"#{run_id} later")
    expect(header).to_be_visible(timeout=PAGE_TIMEOUT_MS)  # no reload
    expect(page.get_by_text("No runs yet")).to_have_count(0)
