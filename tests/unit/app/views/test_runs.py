"""The Runs page (app/views/runs.py) on a real, seeded database: the runs with their status, step
and cost, the filters by status and tag, the search, why a run waits, its summary metrics, and
archived runs (issue 29, items 7 and 8); what a person sees in a real browser is
tests/browser/test_workspace_browser.py.
"""

from __future__ import annotations

import html
import json
import re

import pytest
import streamlit as st
from sqlalchemy.orm import Session, sessionmaker
from streamlit.proto.WidgetStates_pb2 import WidgetState
from streamlit.testing.v1 import AppTest

from db.models import Run
from db.requests import create_run
from db.states import RunStatus
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.inventory import Inventory
from db.vocabulary.scheduler_file import SchedulerFile
from db.vocabulary.settings import Settings
from db.vocabulary.settings_file import write_values
from tests.unit.app.pages import add_run, no_exception, open_page, seeded, sessions, settings
from tests.unit.apptest import new_app

__all__ = ["seeded", "sessions", "settings"]  # the fixtures, from the helper module
FEW_COLUMNS = ["run", "name", "status", "waiting for", "best loss", "headline"]
# A start time as shown: the time of day, with the date when it falls on another day (a test just
# before midnight).
AT = r"(?:\w{3} \d\d \w{3} )?\d\d:\d\d"


def test_the_runs_page_searches_shows_why_a_run_waits_and_its_summary_metrics(
        seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        s.get_one(Run, seeded["queued"]).status_reason = "waiting for 2 free CPU slots"
        s.commit()
    at = open_page("views/runs.py")
    no_exception(at)
    # With every default column the reason ends in "…" to fit the grid at 1280 px; with fewer, whole.
    assert at.dataframe[0].value.set_index("id").loc[seeded["queued"], "waiting for"].endswith("…")
    at.multiselect(key="runs_columns").set_value(FEW_COLUMNS).run()
    table = at.dataframe[0].value.set_index("id")
    # No scheduler has said what this machine has, so no start time is made up.
    # Short in its cell (the queue's line and the Run page say why the start is not known).
    assert table.loc[seeded["queued"], "waiting for"] == "start not known; waiting for 2 free CPU slots"
    assert table.loc[seeded["running"], "waiting for"] == ""  # only a waiting run says why
    assert table.loc[seeded["running"], "best loss"] == f"{(2.0 / 120 * 2 + 0.01) / 2:.4g}"
    assert table.loc[seeded["queued"], "best loss"] == "–"  # no loss yet: never "None"
    assert table.loc[seeded["running"], "headline"] == "Eval accuracy 87.5%"
    at.text_input(key="runs_search").input("DIGITS-A").run()  # any case
    no_exception(at)
    assert at.dataframe[0].value["name"].tolist() == ["digits-a"]
    at.text_input(key="runs_search").input("no-such-run").run()
    assert not at.dataframe and "No run matches" in at.info[0].value


def test_a_queued_run_says_when_it_starts_and_the_page_when_the_queue_is_done(
        seeded: dict[str, int], settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        holds = s.get_one(Run, seeded["running"]).nproc
        s.get_one(Run, seeded["queued"]).status_reason = "queued: waiting for 2 free CPU slot(s)"
        s.commit()
    # The scheduler publishes a machine the running run fills: the queued run waits for it to end.
    SchedulerFile(settings.scheduler_file).write({"inventory": Inventory(kind="cpu", slots=holds).to_json()})
    at = open_page("views/runs.py")
    no_exception(at)
    at.multiselect(key="runs_columns").set_value(FEW_COLUMNS).run()  # room for the whole reason
    cell = at.dataframe[0].value.set_index("id").loc[seeded["queued"], "waiting for"]
    assert re.fullmatch(rf"starts ≈ {AT}, after run {seeded['running']}; queued: waiting for 2 free CPU "
                        r"slot\(s\)", cell), cell
    assert any(re.fullmatch(rf"1 run\(s\) queued here; all done ≈ {AT} \(in .+\)\.", c.value)
               for c in at.caption), [c.value for c in at.caption]


def test_archived_runs_are_hidden_until_shown_and_sorted_as_asked(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        done = add_run(s, settings, "b-done", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
        add_run(s, settings, "a-queued")
        s.get_one(Run, done).archived = True
        s.commit()
    at = open_page("views/runs.py")
    assert at.dataframe[0].value["name"].tolist() == ["a-queued"]
    at.toggle(key="runs_archived").set_value(True).run()
    assert at.dataframe[0].value["name"].tolist() == ["a-queued", "b-done (archived)"]
    at.selectbox(key="runs_sort").set_value("name").run()
    at.toggle(key="runs_reverse").set_value(True).run()
    no_exception(at)
    assert at.dataframe[0].value["name"].tolist() == ["b-done (archived)", "a-queued"]


# -- Runs page ------------------------------------------------------------------------------


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_runs_page_lists_runs_with_status_and_step(seeded: dict[str, int]) -> None:
    at = new_app().run()
    no_exception(at)
    assert at.title[0].value == "Runs"
    table = at.dataframe[0].value.set_index("id")
    assert list(table.index) == [seeded["running"], seeded["queued"]]  # newest first
    assert table.loc[seeded["running"], "name"] == "digits-a"
    assert table.loc[seeded["running"], "status"] == "RUNNING"
    assert table.loc[seeded["running"], "step"] == "120/300"
    assert table.loc[seeded["running"], "progress"] == 40  # whole percent
    assert table.loc[seeded["running"], "attempts"] == 1
    assert table.loc[seeded["queued"], "status"] == "QUEUED"
    assert table.loc[seeded["queued"], "step"] == "0/300"
    dollars = {col: float(table.loc[seeded["running"], col].lstrip("$").replace(",", ""))
               for col in ("cost", "projected")}
    assert 0 < dollars["cost"] < dollars["projected"]  # running, 40% done: more to pay
    assert table.loc[seeded["queued"], "projected"] == table.loc[seeded["queued"], "cost"] == "$0.0000"


def test_runs_page_shows_energy_and_your_cost_beside_the_cloud_reference(settings: Settings,
                                                                        seeded: dict[str, int]) -> None:
    """Without a tariff your cost is "–" (the column's help says to set it in Settings); with one,
    a number of its own, never the cloud reference's ("Cloud ref.", the column that was "cost")."""
    at = new_app().run()
    no_exception(at)
    table = at.dataframe[0].value.set_index("id")
    assert table.loc[seeded["running"], "your cost"] == "–"
    assert table.loc[seeded["running"], "energy"] == "–"  # not measured here
    write_values(settings.home, {("cost", "electricity_usd_per_kwh"): 0.30, ("cost", "hardware_usd_per_gpu"): 8760.0,
                                 ("cost", "hardware_life_years"): 0.5})
    st.cache_data.clear()  # the list is cached for a refresh or two
    at.run()
    table = at.dataframe[0].value.set_index("id")
    yours = table.loc[seeded["running"], "your cost"]
    assert yours.startswith("$") and yours != table.loc[seeded["running"], "cost"]
    assert table.loc[seeded["queued"], "your cost"] == "$0.0000"
    assert json.loads(at.dataframe[0].proto.columns)["cost"]["label"] == "Cloud ref."


def test_runs_page_status_filter(seeded: dict[str, int]) -> None:
    at = new_app().run()
    at.multiselect[0].select("QUEUED").run()
    no_exception(at)
    assert at.dataframe[0].value["name"].tolist() == ["queued-one"]


def test_runs_page_without_runs_points_to_new_run(settings: Settings) -> None:
    at = new_app().run()
    no_exception(at)
    assert not at.dataframe
    assert "No runs yet" in at.info[0].value


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_runs_page_filters_by_tag(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        for name, tags in (("a", ["baseline"]), ("b", ["sweep", "lr"]), ("c", [])):
            config = RunConfig.model_validate({"name": name, "tags": tags})
            run = create_run(s, config, settings.runs_dir, Price(1.0, "x"))
            s.flush()
            assert run.id
        s.commit()
    at = new_app().run()
    no_exception(at)
    assert at.multiselect[1].options == ["baseline", "lr", "sweep"]
    at.multiselect[1].set_value(["sweep"]).run()
    assert at.dataframe[0].value["name"].tolist() == ["b"]


def as_shown(markdown: str) -> str:
    """Markdown a page escaped with style.plain, as a person reads it."""
    return html.unescape(markdown.replace("\\", ""))


def test_the_runs_page_filters_on_numbers_groups_selects_all_and_draws_the_selected(
        seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        running = s.get_one(Run, seeded["running"])
        running.tags_json = json.dumps(["a"])
        config = json.loads(running.config_json)
        config["train"]["lr"] = 0.5
        running.config_json = json.dumps(config)
        s.commit()
    at = open_page("views/runs.py")
    at.text_input(key="runs_filter").input("best loss < 1").run()
    no_exception(at)
    assert at.dataframe[0].value["name"].tolist() == ["digits-a"]  # the queued run has no loss: none
    assert any("1 of them with best loss < 1" in as_shown(c.value) for c in at.caption)
    at.text_input(key="runs_filter").input("best los < 1, steps > many").run()
    said = as_shown(at.warning[0].value)
    assert "“best los” is no field to filter on" in said and "“many” is not a number" in said
    assert "The fields: best loss, headline, steps" in said and len(at.dataframe[0].value) == 2  # not applied
    at.text_input(key="runs_filter").input("").run()

    at.selectbox(key="runs_group").set_value("tag").run()
    no_exception(at)
    headings = [m.value for m in at.markdown if m.value.startswith("**tag") or m.value.startswith("**no tag")]
    assert headings == [f"**tag a** · 1 run · best loss {(2.0 / 120 * 2 + 0.01) / 2:.4g}",
                        "**no tag** · 1 run · best loss –"]
    assert [t.value["name"].tolist() for t in at.dataframe] == [["digits-a"], ["queued-one"]]
    at.selectbox(key="runs_group").set_value("train.lr").run()  # the key that differs is offered
    assert [m.value.split(" · ")[0] for m in at.markdown if m.value.startswith("**train.lr")] == [
        "**train.lr = 0.001**", "**train.lr = 0.5**"]  # in the values' order

    at.button(key="runs_select_all").click().run()  # in every group
    no_exception(at)
    assert at.button(key="runs_compare").label == "Compare 2 runs"
    assert any(m.value == "**Parallel coordinates** of the 2 selected runs" for m in at.markdown)
    at.button(key="runs_select_none").click().run()
    assert at.button(key="runs_compare").label == "Compare"
    assert not any(m.value.startswith("**Parallel coordinates**") for m in at.markdown)


def check_rows(at: AppTest, key: str, rows: list[int]) -> AppTest:
    """A person checks ``rows`` of the grid ``key`` (unchecking the others), as the browser says it:
    the positions of the rows it shows (AppTest has no way to click a grid's row)."""
    frame = next(d for d in at.dataframe if d.key == key)
    states = at._tree.get_widget_states()
    states.widgets.append(WidgetState(id=frame.proto.id, string_value=json.dumps(
        {"selection": {"rows": rows, "columns": [], "cells": []}})))
    at._run(states)
    no_exception(at)
    return at


def checked(at: AppTest, key: str = "runs_table") -> list[str]:
    """The names of the runs whose rows the grid ``key`` checks."""
    names = next(d for d in at.dataframe if d.key == key).value["name"].tolist()
    return [names[i] for i in at.session_state[key]["selection"]["rows"]]


def test_a_selection_is_of_runs_and_follows_them_when_the_rows_move(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """The grid keeps the positions of its checked rows; a new run at the top, another sort or a
    tag's second table must not make the actions act on other runs (issue 56 review, item 1)."""
    with sessions() as s:
        ids = {name: add_run(s, settings, name) for name in ("b", "c", "a")}  # newest first: a, c, b
        s.commit()
    at = open_page("views/runs.py")
    assert at.dataframe[0].value["name"].tolist() == ["a", "c", "b"]
    check_rows(at, "runs_table", [1])  # c
    assert at.button(key="runs_open").label == f"Open run #{ids['c']}"
    at.selectbox(key="runs_sort").set_value("name").run()  # a, b, c: c moved from the second row to the third
    no_exception(at)
    assert checked(at) == ["c"] and at.button(key="runs_open").label == f"Open run #{ids['c']}"
    at.selectbox(key="runs_sort").set_value("newest").run()
    with sessions() as s:  # a new run arrives at the top
        ids["d"] = add_run(s, settings, "d")
        s.get_one(Run, ids["d"]).tags_json = json.dumps(["x", "y"])
        s.commit()
    st.cache_data.clear()
    at.run()
    assert at.dataframe[0].value["name"].tolist() == ["d", "a", "c", "b"]
    assert checked(at) == ["c"] and at.button(key="runs_open").label == f"Open run #{ids['c']}"
    check_rows(at, "runs_table", [0, 2])  # d and c, as the person sees them
    assert at.button(key="runs_compare").label == "Compare 2 runs"

    at.selectbox(key="runs_group").set_value("tag").run()  # d is in the tables of x and of y
    no_exception(at)
    assert checked(at, "runs_table-tag-x") == checked(at, "runs_table-tag-y") == ["d"]
    assert at.button(key="runs_select_all").help == "Select every run shown (4)"  # four runs, five rows
    check_rows(at, "runs_table-tag-x", [])  # unchecked in one table: in the other too
    assert checked(at, "runs_table-tag-y") == [] and checked(at, "runs_table-tag-not set") == ["c"]
    check_rows(at, "runs_table-tag-not set", [0, 2])  # a and b (c unchecked)
    assert checked(at, "runs_table-tag-not set") == ["a", "b"]
    at.button(key="runs_compare").click().run()  # compares the runs selected, whatever their rows
    no_exception(at)
    assert at.query_params["runs"] == f"{ids['b']},{ids['a']}"
