"""One sweep's page (app/views/sweep.py): its header, the parallel coordinates' data, the trial
table (filtered by the brush), the importance and the other charts, and the buttons, which make
the same requests as `runyard sweep`."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Button

from db.models import Run, Sweep
from db.vocabulary.settings import Settings
from tests.unit.app.pages import add_sweep, chart_spec, no_exception, open_page, sessions, settings

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module


def button(at: AppTest, key: str) -> Button:
    return next(b for b in at.button if b.key == key)


def titles(at: AppTest) -> list[str]:
    return [str(chart_spec(c).get("title", {}).get("text", chart_spec(c).get("title", "")))
            if isinstance(chart_spec(c).get("title"), dict) else str(chart_spec(c).get("title", ""))
            for c in at.get("vega_lite_chart")]


def test_the_sweep_page_shows_its_trials_importance_and_charts(settings: Settings,
                                                              sessions: sessionmaker[Session]) -> None:
    sweep_id = add_sweep(sessions, settings)
    at = open_page("views/sweep.py", id=str(sweep_id))
    no_exception(at)
    assert at.title[0].value == f"Sweep #{sweep_id} digits-lr"
    badge = next(m.value for m in at.markdown if "-badge[" in m.value)
    assert badge.startswith(":blue-badge[") and "RUNNING" in badge
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Best eval_loss"] == "0.28" and metrics["Trials"] == "6 / 8"
    table = at.dataframe[0].value
    assert table["trial"].tolist() == [0, 1, 2, 3, 4, 5]
    states = dict(zip(table["trial"], table["state"], strict=True))
    assert states[0] == "SUCCEEDED" and states[5] == "RUNNING"
    assert states[1] == "stopped early at step 12"  # PRUNED, in words, at its run's step
    assert table.loc[table["trial"] == 2, "rung"].item() == "1 (step 30)"
    assert table.loc[table["trial"] == 2, "objective"].item() == pytest.approx(0.28)
    assert table["workload.hidden"].tolist() == ["64", "32", "128", "32", "128", "64"]
    assert table["run"].str.startswith("run?run=").all()
    chart_titles = titles(at)
    assert "Parameter importance" in chart_titles
    assert "eval_loss against each parameter" in chart_titles and "Best eval_loss so far" in chart_titles
    assert "eval_loss of every trial, coloured by its objective" in chart_titles
    assert button(at, f"sweep-pause-{sweep_id}") and button(at, f"sweep-promote-{sweep_id}")


def test_the_parallel_coordinates_draw_every_trial_and_the_brush_filters_the_table(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    sweep_id = add_sweep(sessions, settings)
    at = open_page("views/sweep.py", id=str(sweep_id))
    component = at.get("bidi_component")[0]
    assert component.proto.component_name == "runyard.parallel_coordinates" and component.proto.js_content
    sent = json.loads(component.proto.json)
    axes = [(a["key"], a["kind"]) for a in sent["axes"]]
    assert axes == [("train.lr", "log"), ("workload.hidden", "choice"), ("objective", "linear")]
    assert [t["number"] for t in sent["trials"]] == [0, 1, 2, 3, 4, 5]
    # A brush, as the component sends it: the table keeps the trials in it.
    at.session_state[f"sweep-parallel-{sweep_id}"] = {"selection": {"numbers": [0, 2, 9], "brushes": {
        "train.lr": {"from": 1e-3, "to": 5e-3}}}}
    at.run()
    no_exception(at)
    assert at.dataframe[0].value["trial"].tolist() == [0, 2]
    assert any("2 of 6 trials in the brush" in c.value for c in at.caption)


def test_pause_resume_limits_and_cancel_act_on_the_sweep(settings: Settings,
                                                        sessions: sessionmaker[Session]) -> None:
    sweep_id = add_sweep(sessions, settings)
    at = open_page("views/sweep.py", id=str(sweep_id))
    button(at, f"sweep-pause-{sweep_id}").click().run()
    no_exception(at)
    with sessions() as s:
        assert s.get_one(Sweep, sweep_id).status == "PAUSED"
    button(at, f"sweep-resume-{sweep_id}").click().run()
    at.number_input(key=f"sweep-max-concurrent-{sweep_id}").set_value(3)
    next(b for b in at.button if b.label == "Save").click().run()
    no_exception(at)
    with sessions() as s:
        sweep = s.get_one(Sweep, sweep_id)
        assert (sweep.status, sweep.max_concurrent, sweep.max_trials) == ("RUNNING", 3, 8)
    button(at, f"sweep-cancel-{sweep_id}").click().run()
    no_exception(at)
    with sessions() as s:
        assert s.get_one(Sweep, sweep_id).status == "CANCELLED"
    assert not [b for b in at.button if b.key and b.key.startswith(f"sweep-pause-{sweep_id}")]


def test_promote_continues_a_trial_stopped_early(settings: Settings, sessions: sessionmaker[Session]) -> None:
    sweep_id = add_sweep(sessions, settings)
    at = open_page("views/sweep.py", id=str(sweep_id))
    at.selectbox(key=f"sweep-promote-pick-{sweep_id}").set_value(3).run()
    button(at, f"sweep-promote-{sweep_id}").click().run()
    no_exception(at)
    with sessions() as s:
        names = {r.name: r.status for r in s.query(Run)}
    assert names["digits-lr-t3"] == "QUEUED" and names["digits-lr-t1"] == "PRUNED"  # only the chosen one


def test_an_unknown_sweep_says_where_to_find_one(settings: Settings) -> None:
    at = open_page("views/sweep.py", id="42")
    no_exception(at)
    assert "No sweep #42 here" in at.info[0].value
