"""The Run page's metric charts (app/views/run.py, drawn by app/chart_widgets.py): the main curves
and the pinned ones, one chart per metric with every rank, the chart options, superseded steps,
a retry's curves, what a live refresh fetches and builds again, and the log axis it opens on.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import streamlit as st
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from app.charts import metric as app_charts
from db.metricstore import write_points
from db.models import Attempt
from db.states import AttemptStatus, RunStatus
from db.vocabulary.settings import Settings
from tests.unit.app.pages import (
    add_attempt,
    add_metrics,
    add_run,
    chart_data,
    chart_frames,
    chart_lines,
    chart_spec,
    chart_title,
    metric_chart_elements,
    no_exception,
    open_page,
    seeded,
    sessions,
    settings,
    show_section,
)

__all__ = ["seeded", "sessions", "settings"]  # the fixtures, from the helper module


def test_the_run_page_opens_on_its_main_curves_and_a_person_pins_others(seeded: dict[str, int],
                                                                        sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    with sessions() as s:  # a third metric, not shown on the Overview unless pinned
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=step, key="lr", value=0.001,
                                           wall_time=time.time()) for step in (10, 20)])
        s.commit()
    at = open_page("views/run.py", run=str(run_id))  # the page a Start lands on: Overview
    assert [chart_title(c) for c in metric_chart_elements(at)] == ["Loss", "Eval accuracy"]
    assert len(chart_data(metric_chart_elements(at)[0])) == 2 * 12  # every step on both ranks
    at.button_group(key=f"pin-{run_id}").set_value(["loss", "lr"]).run()
    no_exception(at)
    assert [chart_title(c) for c in metric_chart_elements(at)] == ["Loss", "Learning rate"]
    show_section(at, "Metrics")  # every curve is still on the Metrics section
    assert sorted(chart_title(c) for c in metric_chart_elements(at)) == ["Eval accuracy", "Learning rate", "Loss"]
    assert [chart_title(c) for c in metric_chart_elements(show_section(at, "Overview"))] == ["Loss", "Learning rate"]


def test_run_page_draws_one_chart_per_metric_with_every_rank(seeded: dict[str, int]) -> None:
    at = show_section(open_page("views/run.py", run=str(seeded["running"])), "Metrics")
    charts = metric_chart_elements(at)
    titles = [chart_title(c) for c in charts]
    assert titles == ["Loss", "Eval accuracy"]  # metric charts titled by the registry, loss first
    assert len(at.get("vega_lite_chart")) == 1  # the rank legend strip above them (the charts: live ones)
    loss = chart_data(charts[0])
    assert sorted(loss["rank"].unique()) == ["0", "1"]
    assert len(loss) == 2 * 12  # steps 10..120 on two ranks
    assert loss["step"].max() == 120


def test_charts_are_built_again_only_when_their_buckets_change(
        seeded: dict[str, int], settings: Settings, sessions: sessionmaker[Session],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished run's charts cannot change: a second tab and every refresh draw the charts the
    first tab built (Altair's build is about 75 ms a chart of 8 ranks), and so does the rank legend
    of any run; two finished runs never share one. A live run's chart is built again at a refresh
    that brings new buckets, and not at one that brings none (slow steps, an evaluation)."""
    with sessions() as s:
        done = {}
        for name, last_step in (("done", 300), ("done-sooner", 200)):
            done[name] = add_run(s, settings, name, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
            add_attempt(s, done[name], last_step=last_step, status=AttemptStatus.SUCCEEDED)
            add_metrics(s, done[name], last_step=last_step)
        s.commit()
    built: list[str] = []
    legends: list[int] = []
    metric_view, rank_legend = app_charts.metric_view, app_charts.rank_legend

    def counted_view(*args: Any, **kwargs: Any) -> Any:
        built.append(args[3])
        return metric_view(*args, **kwargs)

    def counted_legend(ranks: Any) -> Any:
        legends.append(len(ranks))
        return rank_legend(ranks)

    monkeypatch.setattr(app_charts, "metric_view", counted_view)
    monkeypatch.setattr(app_charts, "rank_legend", counted_legend)

    def drawn(at: AppTest) -> list[tuple[str, list[tuple[int, str]]]]:
        """Each metric chart's title and its lines' (step, rank) rows."""
        return [(chart_title(c), sorted(zip(chart_lines(c)["step"], chart_lines(c)["rank"], strict=True)))
                for c in metric_chart_elements(at)]

    first_tab = show_section(open_page("views/run.py", run=str(done["done"])), "Metrics")
    first = drawn(first_tab)
    assert [t for t, _ in first] == ["Loss", "Eval accuracy"] and len(first[0][1]) == 2 * 30
    assert built and legends == [2]
    builds = len(built)
    second_tab = show_section(open_page("views/run.py", run=str(done["done"])), "Metrics")
    assert drawn(second_tab) == first
    second_tab.run()  # a refresh
    no_exception(second_tab)
    assert drawn(second_tab) == first and len(built) == builds and legends == [2]
    other = show_section(open_page("views/run.py", run=str(done["done-sooner"])), "Metrics")
    assert len(drawn(other)[0][1]) == 2 * 20  # its own 20 steps, not the first run's chart
    assert len(built) > builds
    builds = len(built)
    live = show_section(open_page("views/run.py", run=str(seeded["running"])), "Metrics")
    assert len(built) > builds
    builds, drawn_live = len(built), drawn(live)
    live.run()  # a refresh with nothing new
    no_exception(live)
    assert len(built) == builds and drawn(live) == drawn_live
    with sessions() as s:  # rank 0 and 1 log step 130
        write_points(s.connection(), [dict(run_id=seeded["running"], attempt=1, rank=rank, step=130, key="loss",
                                           value=0.01, wall_time=time.time()) for rank in (0, 1)])
        s.commit()
    live.run()
    no_exception(live)
    loss = dict(drawn(live))["Loss"]
    assert len(built) == builds + 1 and (130, "0") in loss and (130, "1") in loss  # the loss chart alone
    assert legends == [2]  # the live run's legend too was drawn from the cache


def test_run_page_chart_options_mean_band_wall_time_log_and_ema(seeded: dict[str, int]) -> None:
    run_id = seeded["running"]
    at = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    assert at.segmented_control(key=f"ranks-{run_id}").value == "per rank"
    at.segmented_control(key=f"ranks-{run_id}").set_value("mean + band")
    at.segmented_control(key=f"x-{run_id}").set_value("wall time")
    at.button_group(key=f"log-{run_id}").set_value(["loss"])  # the log scale is picked per chart
    at.slider(key=f"ema-{run_id}").set_value(0.6)
    at.run()
    no_exception(at)
    loss = metric_chart_elements(at)[0]
    rows = chart_lines(loss)
    assert rows["rank"].unique().tolist() == ["mean"]
    assert len(rows) == 12  # one point per step: the mean of ranks 0 and 1
    assert rows["value"].iloc[0] == pytest.approx(2.0 / 10 + 0.005)
    assert rows["lo"].iloc[0] == pytest.approx(0.2) and rows["hi"].iloc[0] == pytest.approx(0.21)
    assert rows["smooth"].notna().all()
    spec = json.dumps(chart_spec(loss))
    assert '"type": "log"' in spec and '"type": "temporal"' in spec
    # band, faint mean, smoothed mean, the hover read-out
    assert [layer["mark"]["type"] for layer in chart_spec(loss)["layer"]] == ["area", "line", "line", "rule"]
    assert '"type": "log"' not in json.dumps(chart_spec(metric_chart_elements(at)[1]))  # eval_accuracy: linear
    # The choice is kept for this run across refreshes.
    at.run()
    assert at.segmented_control(key=f"ranks-{run_id}").value == "mean + band"
    assert chart_lines(metric_chart_elements(at)[0])["rank"].unique().tolist() == ["mean"]


def test_run_page_hides_superseded_steps_unless_asked(settings: Settings, sessions: sessionmaker[Session]) -> None:
    # Attempt 1 logged up to step 120; attempt 2 resumed from the checkpoint at step 50.
    now = time.time()
    with sessions() as s:
        run_id = add_run(s, settings, "resumed", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, last_step=120, status=AttemptStatus.FAILED)
        s.add(Attempt(run_id=run_id, number=2, status="RUNNING", dir="/x", started_at=now - 10, resume_step=50,
                      last_step=80))
        add_metrics(s, run_id, last_step=120)
        write_points(s.connection(), [dict(run_id=run_id, attempt=2, rank=rank, step=step, key="loss", value=0.5,
                                           wall_time=now) for step in (60, 70, 80) for rank in (0, 1)])
        s.commit()
    at = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    lines = chart_lines(metric_chart_elements(at)[0])
    assert set(lines[lines["attempt"] == 1]["step"]) == {10, 20, 30, 40, 50}  # attempt 1 up to the resume step
    assert set(lines[lines["attempt"] == 2]["step"]) == {60, 70, 80}
    loss = metric_chart_elements(at)[0]
    frames = chart_frames(loss)
    assert not any("superseded" in f and f["superseded"].any() for f in frames)  # lines and hover: lineage only
    at.toggle(key=f"superseded-{run_id}").set_value(True).run()
    no_exception(at)
    loss = metric_chart_elements(at)[0]
    frames = chart_frames(loss)
    old = next(f for f in frames if "superseded" in f and f["superseded"].all())
    assert set(old["step"]) == set(range(60, 121, 10)) and set(old["attempt"]) == {1}
    assert any(layer["mark"].get("strokeDash") for layer in chart_spec(loss)["layer"])


def test_during_a_retry_the_first_attempts_curve_stays_whole_until_the_next_one_trains(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    # Attempt 1 logged up to step 120 and failed; attempt 2, from the checkpoint at step 50, is
    # still starting (no step yet): nothing of attempt 1 is superseded yet.
    now = time.time()
    with sessions() as s:
        run_id = add_run(s, settings, "retrying", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, last_step=120, status=AttemptStatus.FAILED)
        s.add(Attempt(run_id=run_id, number=2, status="RUNNING", dir="/x", started_at=now - 2, resume_step=50))
        add_metrics(s, run_id, last_step=120)
        s.commit()
    at = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    lines = chart_lines(metric_chart_elements(at)[0])
    assert set(lines["step"]) == set(range(10, 121, 10)) and set(lines["attempt"]) == {1}
    assert not [i.value for i in at.info if "Waiting for the first metrics" in i.value]
    with sessions() as s:  # attempt 2 trains: what attempt 1 did after step 50 is superseded now
        s.execute(update(Attempt).where(Attempt.run_id == run_id, Attempt.number == 2)
                  .values(first_step_at=now, last_step=60))
        write_points(s.connection(), [dict(run_id=run_id, attempt=2, rank=rank, step=60, key="loss", value=0.5,
                                           wall_time=now) for rank in (0, 1)])
        s.commit()
    st.cache_data.clear()
    at.run()
    no_exception(at)
    lines = chart_lines(metric_chart_elements(at)[0])
    assert set(lines[lines["attempt"] == 1]["step"]) == {10, 20, 30, 40, 50}
    assert set(lines[lines["attempt"] == 2]["step"]) == {60}


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_run_page_live_panel_fetches_only_new_buckets(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    at = open_page("views/run.py", run=str(run_id))  # the Overview: its badges count NaNs in the series
    held = at.session_state[f"live-series/{run_id}/loss"]
    assert held.level == 0 and len(held.rows) == 24 and held.fetched == 24
    show_section(at, "Metrics")
    held = at.session_state[f"live-series/{run_id}/loss"]
    assert len(held.rows) == 24 and held.fetched == 2  # only step 120 (the last cached bucket) again, on 2 ranks
    now = time.time()
    with sessions() as s:
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=rank, step=step, key="loss", value=0.01,
                                           wall_time=now) for step in range(130, 201, 10) for rank in (0, 1)])
        s.commit()
    at.run()
    no_exception(at)
    held = at.session_state[f"live-series/{run_id}/loss"]
    assert held.fetched == 2 * 9  # step 120 again (the last cached bucket) and the 8 new steps, on 2 ranks
    loss = chart_lines(metric_chart_elements(at)[0])
    assert len(loss) == 2 * 20 and loss["step"].max() == 200


def test_a_loss_spanning_more_than_two_decades_opens_on_a_log_axis_until_a_person_chooses(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Issue 29, item 6: on the Overview and the Metrics section; unpicked, it stays linear."""
    with sessions() as s:
        run_id = add_run(s, settings, "decades", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, 2000)
        s.flush()
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=step, key=key, value=value,
                                           wall_time=1000.0 + step)
                                      for step in range(10, 2001, 10)
                                      for key, value in (("loss", 10.0 / step), ("step_time", 0.05 + step * 1e-6))])
        s.commit()

    def log_axes(at: AppTest) -> dict[str, bool]:
        return {chart_title(c): '"type": "log"' in json.dumps(chart_spec(c)) for c in metric_chart_elements(at)}

    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert log_axes(at)["Loss"] is True  # the Overview: 1 down to 0.005
    at = show_section(at, "Metrics")
    assert log_axes(at) == {"Loss": True, "Step time": False}  # 50 to 52 ms: linear
    assert at.button_group(key=f"log-{run_id}").value == ["loss"]
    at.button_group(key=f"log-{run_id}").set_value([]).run()
    assert log_axes(at)["Loss"] is False
    at.run()  # a live refresh keeps the person's choice
    assert log_axes(at)["Loss"] is False
