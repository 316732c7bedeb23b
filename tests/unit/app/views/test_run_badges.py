"""The Run page's badges (app/views/run.py): events and NaNs counted (every metric's NaNs, drawn
or not), and for each health check whether it found nothing or did not run, and why.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import streamlit as st
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from app.charts.layers import NAN_COLOR
from app.panels import layout as panel_layout
from db.metricstore import write_points
from db.models import Attempt, Event
from db.requests import create_run
from db.states import AttemptStatus, RunStatus, transition
from db.vocabulary.checks import CHECKS_EVENT, checks_message
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from db.workspace.layouts import Layout, save_layout
from tests.unit.app.pages import (
    add_heartbeat,
    chart_spec,
    chart_title,
    event_badges,
    metric_chart_elements,
    no_exception,
    open_page,
    seeded,
    sessions,
    settings,
    show_section,
)

__all__ = ["seeded", "sessions", "settings"]  # the fixtures, from the helper module


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_run_page_badges_count_events_and_nan(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    now = time.time()
    with sessions() as s:
        s.add(Event(run_id=run_id, attempt=1, at=now, level="info", kind=CHECKS_EVENT, message=checks_message({})))
        for kind, level in (("straggler", "warning"), ("straggler", "warning"), ("desync", "error")):
            s.add(Event(run_id=run_id, attempt=1, at=now, level=level, kind=kind, message=f"{kind} on rank 1"))
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=1, step=130, key="loss",
                                           value=float("nan"), wall_time=now)])
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    badges = event_badges(at)
    assert "straggler × 2" in badges and "orange-badge" in badges
    assert "desync × 1" in badges and "NaN × 1" in badges  # no "nan" event: counted from the buckets
    assert "hang ×" not in badges and ":green-badge[:material/check: no hangs]" in badges
    assert "not checked" not in badges
    events = next(d.value for d in at.dataframe if "kind" in d.value)
    assert sorted(events["kind"]) == ["desync", "straggler", "straggler"]
    loss = metric_chart_elements(show_section(at, "Metrics"))[0]
    marks = [(layer["mark"]["type"], layer["mark"].get("color")) for layer in chart_spec(loss)["layer"]]
    assert ("rule", NAN_COLOR) in marks  # the NaN is marked


def test_a_nan_in_a_metric_not_drawn_shows_on_the_overview_and_on_metrics(seeded: dict[str, int],
                                                                         sessions: sessionmaker[Session]) -> None:
    """Nothing emits a "nan" event: the badge counts the run's NaNs in every metric, not only in the
    charts drawn (the Overview's two, the Metrics section's open ones), and leaves out a NaN that an
    abandoned attempt logged after the step the run was resumed from."""
    run_id = seeded["running"]
    now = time.time()
    with sessions() as s:
        s.add(Event(run_id=run_id, attempt=1, at=now, level="info", kind=CHECKS_EVENT, message=checks_message({})))
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=rank, step=step, key="train/grad_norm",
                                           value=float("nan") if step in (60, 110) else 1.0, wall_time=now)
                                      for step in (50, 60, 110) for rank in (0, 1)])
        s.execute(update(Attempt).where(Attempt.run_id == run_id).values(status=AttemptStatus.CRASHED.value))
        s.add(Attempt(run_id=run_id, number=2, status=AttemptStatus.RUNNING.value, resume_step=100, last_step=120,
                      dir="/nonexistent/2", started_at=now - 5, first_step_at=now - 3))  # step 110 abandoned
        save_layout(s, panel_layout.folder_owner(), Layout(sections={"train": False}))  # the person closed it
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert "Gradient norm" not in " ".join(chart_title(c) for c in metric_chart_elements(at))
    assert ":red-badge[:material/error: NaN × 2]" in event_badges(at)  # step 60 on two ranks; not step 110
    at = show_section(at, "Metrics")
    assert "Gradient norm" not in " ".join(chart_title(c) for c in metric_chart_elements(at))
    assert ":red-badge[:material/error: NaN × 2]" in event_badges(at)
    assert "no stragglers, desyncs or hangs" in event_badges(at)


def test_run_page_without_findings_says_so_for_the_checks_that_ran(seeded: dict[str, int],
                                                                   sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    at = open_page("views/run.py", run=str(run_id))  # no rank said yet which checks it runs
    badges = event_badges(at)
    assert ":green-badge[:material/check: no NaNs or hangs]" in badges
    assert ":gray-badge[:material/help: stragglers or desyncs not checked (no metrics logged yet)]" in badges
    with sessions() as s:
        s.add(Event(run_id=run_id, attempt=1, at=time.time(), level="info", kind=CHECKS_EVENT,
                    message=checks_message({})))
        s.commit()
    st.cache_data.clear()  # the page caches the run's detail for a few seconds
    badges = event_badges(open_page("views/run.py", run=str(run_id)))
    assert "no stragglers, desyncs, NaNs or hangs" in badges and "not checked" not in badges


def test_run_page_of_a_queued_run_or_one_rank_says_what_was_not_checked(seeded: dict[str, int],
                                                                       sessions: sessionmaker[Session]) -> None:
    badges = event_badges(open_page("views/run.py", run=str(seeded["queued"])))
    assert badges == (":gray-badge[:material/help: stragglers, desyncs, NaNs or hangs not checked "
                      "(the run has not started)]")  # no green check for a run that never ran
    run_id = seeded["running"]
    with sessions() as s:
        s.add(Event(run_id=run_id, attempt=1, at=time.time(), level="info", kind=CHECKS_EVENT,
                    message=checks_message({"stragglers": "one rank, nothing to compare",
                                            "desyncs": "one rank, nothing to compare"})))
        s.commit()
    badges = event_badges(open_page("views/run.py", run=str(run_id)))
    assert ":green-badge[:material/check: no NaNs or hangs]" in badges
    assert "stragglers or desyncs not checked (one rank, nothing to compare)" in badges


def test_run_page_of_a_plain_script_says_nothing_was_checked(settings: Settings,
                                                            sessions: sessionmaker[Session]) -> None:
    """A script that never imports the SDK: no straggler or desync check runs, and before its
    first output and metric neither does the hang or the NaN check, so the page must not say
    that none was found; its steps read from stdout make the hang and NaN checks run, the SDK's
    report the other two."""
    with sessions() as s:
        config = RunConfig.model_validate({"name": "plain", "workload": {"kind": "script", "script": "/p/train.py"}})
        run = create_run(s, config, settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.flush()
        for status in (RunStatus.STARTING, RunStatus.RUNNING):
            assert transition(s, run.id, status, f"test: {status}")
        s.add(Attempt(run_id=run.id, number=1, status=AttemptStatus.RUNNING.value,
                      dir=str(Path(run.run_dir) / "attempts" / "1"), started_at=time.time() - 60))
        add_heartbeat(s, age_s=0.0)
        s.commit()
        run_id = run.id
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    badges = event_badges(at)
    assert "green-badge" not in badges
    assert "stragglers or desyncs not checked (the script has not reported through runyard's SDK)" in badges
    assert "hangs not checked (the script has printed nothing yet)" in badges
    assert "NaNs not checked (no metric recorded yet)" in badges
    # No "Eval accuracy" tile that a script that logs none could never fill (issue 56, item 6).
    assert {"Elapsed", "Goodput", "Your cost"} <= {m.label for m in at.metric} and "Eval accuracy" not in {
        m.label for m in at.metric}
    with sessions() as s:  # its loss lines on stdout: steps and a metric, still no SDK
        now = time.time()
        s.execute(update(Attempt).where(Attempt.run_id == run_id).values(first_step_at=now))
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=10, key="loss", value=2.0,
                                           wall_time=now)])
        s.commit()
    st.cache_data.clear()  # the page caches the run's detail for a few seconds
    badges = event_badges(open_page("views/run.py", run=str(run_id)))
    assert ":green-badge[:material/check: no NaNs or hangs]" in badges
    assert "stragglers or desyncs not checked (the script has not reported through runyard's SDK)" in badges
    with sessions() as s:  # once its ranks report through the SDK, rank 0 says which checks run
        s.add(Event(run_id=run_id, attempt=1, at=time.time(), level="info", kind=CHECKS_EVENT,
                    message=checks_message({})))
        s.commit()
    st.cache_data.clear()
    assert "no stragglers, desyncs, NaNs or hangs" in event_badges(open_page("views/run.py", run=str(run_id)))
