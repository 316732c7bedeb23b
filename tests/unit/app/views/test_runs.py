"""The Runs page as a workspace and the Run page's Edit… (issue 29, items 7 and 8), through
Streamlit's AppTest on a real database; what a person sees in a real browser is
tests/browser/test_workspace_browser.py."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Event, Run
from db.states import RunStatus
from db.vocabulary.settings import Settings
from orchestrator.run_edits import edit_run
from tests.unit.test_app_pages import add_run, no_exception, open_page, seeded, sessions, settings

__all__ = ["seeded", "sessions", "settings"]  # the fixtures, taken from test_app_pages


def test_the_runs_page_searches_shows_why_a_run_waits_and_its_summary_metrics(
        seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        s.get(Run, seeded["queued"]).status_reason = "waiting for 2 free CPU slots"
        s.commit()
    at = open_page("views/runs.py")
    no_exception(at)
    table = at.dataframe[0].value.set_index("id")
    assert table.loc[seeded["queued"], "waiting for"] == "waiting for 2 free CPU slots"
    assert table.loc[seeded["running"], "waiting for"] == ""  # only a waiting run says why
    assert table.loc[seeded["running"], "best loss"] == pytest.approx((2.0 / 120 * 2 + 0.01) / 2)
    assert table.loc[seeded["running"], "headline"] == "Eval accuracy 87.5%"
    at.text_input(key="runs_search").input("DIGITS-A").run()  # any case
    no_exception(at)
    assert at.dataframe[0].value["name"].tolist() == ["digits-a"]
    at.text_input(key="runs_search").input("no-such-run").run()
    assert not at.dataframe and "No run matches" in at.info[0].value


def test_archived_runs_are_hidden_until_shown_and_sorted_as_asked(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        done = add_run(s, settings, "b-done", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
        add_run(s, settings, "a-queued")
        s.get(Run, done).archived = True
        s.commit()
    at = open_page("views/runs.py")
    assert at.dataframe[0].value["name"].tolist() == ["a-queued"]
    at.toggle(key="runs_archived").set_value(True).run()
    assert at.dataframe[0].value["name"].tolist() == ["a-queued", "b-done (archived)"]
    at.selectbox(key="runs_sort").set_value("name").run()
    at.toggle(key="runs_reverse").set_value(True).run()
    no_exception(at)
    assert at.dataframe[0].value["name"].tolist() == ["b-done (archived)", "a-queued"]


def test_edit_on_the_run_page_renames_tags_and_notes_and_keeps_each_change(
        seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    at.text_input(key=f"edit-name-{run_id}").input("digits-b")
    at.multiselect(key=f"edit-tags-{run_id}").set_value(["lr-sweep"])
    at.text_area(key=f"edit-note-{run_id}").input("lr 3e-4 diverged at step 90")
    next(b for b in at.button if b.label == "Save").click().run()
    no_exception(at)
    with sessions() as s:
        run = s.get(Run, run_id)
        assert (run.name, json.loads(run.tags_json), run.note) == ("digits-b", ["lr-sweep"],
                                                                   "lr 3e-4 diverged at step 90")
        edits = s.scalars(select(Event.message).where(Event.run_id == run_id, Event.kind == "edit")
                          .order_by(Event.id)).all()
    assert edits == ["renamed 'digits-a' to 'digits-b' by ui", "tag 'lr-sweep' added by ui",
                     "note set: 'lr 3e-4 diverged at step 90' by ui"]
    at.run()
    header = " ".join(m.value for m in at.markdown)
    assert "digits-b" in header and "lr-sweep" in header and "diverged at step 90" in header
    at.text_input(key=f"edit-name-{run_id}").input("bad name")
    next(b for b in at.button if b.label == "Save").click().run()
    assert "name 'bad name': use letters, digits" in at.toast[0].value.replace("\\", "")  # Markdown-escaped


def test_compare_shows_each_runs_tags_and_the_first_line_of_its_note(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        first = add_run(s, settings, "first")
        second = add_run(s, settings, "second")
        edit_run(s, first, add_tags=["baseline"], note="warmup 100 steps\nthen cosine")
        s.commit()
    at = open_page("views/compare.py", runs=f"{first},{second}")
    no_exception(at)
    summary = at.table[0].value.set_index("run")  # Markdown-escaped cells: \#1
    assert summary.loc["\\#1 first", "tags"] == "baseline" and summary.loc["\\#2 second", "tags"] == "—"
    assert summary.loc["\\#1 first", "note"] == "warmup 100 steps…"  # the rest is on the Run page
