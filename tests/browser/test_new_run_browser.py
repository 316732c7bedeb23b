"""The New run page as a first-time user meets it: a TOML file fills the form (every widget shows
the file's value), the run that Start queues is the file plus what the person changed, a file
with problems lists each one with its key (never a traceback), a pasted TOML pressed Start with
fills the form instead of being dropped, and a refusal in a folded section is summarised above
Start, opens its section, and goes away once the value is fixed. The New sweep page, which shares
its form, is filled by a sweep file the same way and starts exactly it.

    pytest -m browser tests/browser/test_new_run_browser.py
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser.test_ui_browser import PAGE_TIMEOUT_MS, RUN_TIMEOUT_MS, expect, open_page, start_button
from tests.conftest import wait_until

pytestmark = pytest.mark.browser
# The tests share one `runyard up` and read their own runs by id (tests/browser/conftest.py).
SHARES_ONE_RUNYARD_UP = True

GPT_TOML = """\
name = "from-file"
tags = ["upload"]
[workload]
kind = "gpt-char"
n_layer = 2
n_embd = 64
[train]
lr = 0.002
max_steps = 20
[checkpoint]
keep_last = 5
"""


FORM_SHOWS_PASTE = """() => {
    const all = (label) => [...document.querySelectorAll(`input[aria-label="${label}"]`)].map(e => e.value);
    const names = all("Name"), ratios = all("Straggler ratio");
    return names.length > 0 && ratios.length > 0 && names.every(v => v === "fold")
        && ratios.every(v => /^0\\.50*$/.test(v));
}"""


def upload(page: Any, path: Path) -> None:
    page.get_by_test_id("stFileUploader").locator("input[type=file]").set_input_files(str(path))


def test_an_uploaded_toml_fills_the_form_and_start_queues_exactly_it(page: Any, runyard_up: Any,
                                                                       tmp_path: Path) -> None:
    config = tmp_path / "gpt.toml"
    config.write_text(GPT_TOML)
    open_page(page, f"{runyard_up.url}/new", "New run")
    upload(page, config)
    expect(page.get_by_text("Form filled from gpt.toml")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    # The widgets show the file's values, not the defaults.
    expect(page.get_by_label("Name", exact=True)).to_have_value("from-file")
    expect(page.get_by_label("Transformer blocks (n_layer)", exact=True)).to_have_value("2")
    expect(page.get_by_label("Embedding width (n_embd)", exact=True)).to_have_value("64")
    expect(page.get_by_label("Max steps", exact=True)).to_have_value("20")
    # The person changes one thing, then starts.
    page.get_by_label("Name", exact=True).fill("from-file-2")
    start_button(page).click()
    header = page.get_by_role("heading", level=2).filter(has_text=re.compile(r"#\d+ from-file-2"))
    expect(header).to_be_visible(timeout=RUN_TIMEOUT_MS)
    # all_inner_texts, not inner_text: during a fragment redraw the replaced header can still be
    # shown beside the new one, and inner_text() in strict mode fails on two matches.
    run_id = int(re.search(r"#(\d+)", " ".join(header.all_inner_texts())).group(1))  # type: ignore[union-attr]
    queued = runyard_up.cli("show", str(run_id))["config"]
    assert queued["name"] == "from-file-2" and queued["tags"] == ["upload"]
    assert (queued["workload"]["kind"], queued["workload"]["n_layer"], queued["workload"]["n_embd"]) == (
        "gpt-char", 2, 64)
    assert (queued["train"]["lr"], queued["train"]["max_steps"], queued["checkpoint"]["keep_last"]) == (0.002, 20, 5)


def test_a_file_with_problems_lists_each_with_its_key_and_a_folded_refusal_is_summarised(
        page: Any, runyard_up: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[train]\nlr = "fast"\nlrr = 1\n')
    before = {r["id"] for r in runyard_up.cli("ls")}  # the runs of the module's earlier tests
    open_page(page, f"{runyard_up.url}/new", "New run")
    upload(page, bad)
    warning = page.get_by_test_id("stAlert").filter(has_text="Form filled from bad.toml")
    expect(warning).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(warning).to_contain_text("train.lr = 'fast'")
    expect(warning).to_contain_text("train.lrr: unknown key")
    assert page.get_by_test_id("stException").count() == 0

    # A value the widgets cannot refuse, in a folded section (Supervision), pasted as TOML; Start
    # pressed straight away (no "Fill the form") fills the form from the paste and starts nothing.
    page.get_by_text("…or paste TOML").click()
    page.get_by_test_id("stTextArea").filter(has=page.get_by_label("TOML")).locator("textarea").fill(
        'name = "fold"\n[supervision]\nstraggler_ratio = 0.5\n')
    start_button(page).click()
    expect(page.get_by_text("Form filled from the pasted TOML")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_text("the pasted TOML was not in the form yet")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    assert {r["id"] for r in runyard_up.cli("ls")} == before  # nothing queued
    # Start once the form shows what was pasted, as a person would: the message comes first in the
    # rerun that fills the form, and a click while that rerun still streams the fields below sends
    # their old values (seen in CI under load: a valid run was queued and the refusal never came).
    # Every copy of the two fields, not one locator: the replaced ones stay in the page until that
    # rerun ends, and a locator matching two fails in strict mode (CI run 5).
    page.wait_for_function(FORM_SHOWS_PASTE, timeout=PAGE_TIMEOUT_MS)
    start_button(page).click()
    summary = page.get_by_test_id("stAlert").filter(has_text="Not started: 1 problem(s)")
    expect(summary).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(summary).to_contain_text("supervision.straggler_ratio")
    ratio = page.get_by_label("Straggler ratio", exact=True)
    expect(ratio).to_be_visible()  # its section opened
    assert {r["id"] for r in runyard_up.cli("ls")} == before  # nothing queued
    ratio.fill("2")
    ratio.press("Tab")
    start_button(page).click()
    expect(page.get_by_role("heading", level=2).filter(has_text=re.compile(r"#\d+ fold"))).to_be_visible(
        timeout=RUN_TIMEOUT_MS)
    assert [r["name"] for r in runyard_up.cli("ls") if r["id"] not in before] == ["fold"]


SWEEP_TOML = """\
name = "browser-sweep"
[launch]
nproc_per_node = 1
[train]
max_steps = 20
[sweep]
max_trials = 1
[sweep.space]
"train.lr" = {log_uniform = [1e-4, 1e-1]}
"""


def test_a_sweep_file_fills_the_new_sweep_form_and_start_starts_exactly_it(page: Any, runyard_up: Any,
                                                                            tmp_path: Path) -> None:
    """New sweep shares New run's form: the uploaded file fills the base, the [sweep] fields and the
    space box; the preview is shown; Start starts that sweep (cancelled at once: its trial would take
    a slot from the other tests)."""
    config = tmp_path / "sweep.toml"
    config.write_text(SWEEP_TOML)
    open_page(page, f"{runyard_up.url}/new-sweep", "New sweep")
    upload(page, config)
    expect(page.get_by_text("Form filled from sweep.toml")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_label("Name", exact=True)).to_have_value("browser-sweep")
    expect(page.get_by_label("Max trials", exact=True)).to_have_value("1")
    expect(page.get_by_label("The keys to search", exact=True)).to_have_value(
        '"train.lr" = {log_uniform = [0.0001, 0.1]}\n')
    expect(page.get_by_text("1 trial(s), 1 at a time, 20 steps each at most")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    start_button(page).click()
    started = lambda: [s for s in runyard_up.cli("sweep", "ls") if s["name"] == "browser-sweep"]  # noqa: E731
    wait_until(started, timeout=RUN_TIMEOUT_MS / 1000, what="the sweep was not started")
    (sweep,) = started()
    runyard_up.cli("sweep", "cancel", str(sweep["id"]))
    assert (sweep["max_trials"], sweep["searcher"]) == (1, "random")
