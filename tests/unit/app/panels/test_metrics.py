"""The Metrics section of a run with 200 metric names (app/panels/metrics.py): its first sections
open with their first charts, the rest closed, and only the drawn charts' series are fetched from
the metric store; "Show all" draws (and fetches) the rest of a section. Closing a section (its
expander's callback) draws nothing of it and keeps it closed for the person."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from app import data
from app.panels import layout as panel_layout
from app.panels.sections import FIRST_CHARTS, OPEN_WHEN_MANY
from db.metricstore import write_points
from db.states import RunStatus
from db.vocabulary.settings import Settings
from db.workspace.layouts import read_layout
from tests.unit.app.pages import (
    add_attempt,
    add_run,
    chart_title,
    metric_chart_elements,
    no_exception,
    open_page,
    sessions,
    settings,
    show_section,
)

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module

BLOCKS, PER_BLOCK = 10, 20  # 200 metric names in 10 sections


def test_a_run_with_200_metric_names_draws_and_fetches_only_its_first_charts(
        settings: Settings, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    with sessions() as s:
        run_id = add_run(s, settings, "wide", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, last_step=20)
        s.flush()
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=step, key=f"block{b}/m{i}",
                                           value=float(i + step), wall_time=time.time())
                                      for b in range(BLOCKS) for i in range(PER_BLOCK) for step in (10, 20)])
        s.commit()
    fetched: list[str] = []
    fetch = data.metric_series

    def counting(run: int, key: str, *args: Any, **kwargs: Any) -> Any:
        fetched.append(key)
        return fetch(run, key, *args, **kwargs)

    monkeypatch.setattr(data, "metric_series", counting)
    at = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    assert len(at.expander) == BLOCKS
    drawn = OPEN_WHEN_MANY * FIRST_CHARTS
    assert len(metric_chart_elements(at)) == drawn
    assert sorted(set(fetched)) == sorted(f"block{b}/m{i}" for b in range(OPEN_WHEN_MANY) for i in range(FIRST_CHARTS))
    fetched.clear()
    at.button(key=f"show-all-{run_id}-block0").click().run()
    no_exception(at)
    assert len(metric_chart_elements(at)) == drawn + PER_BLOCK - FIRST_CHARTS
    assert {f"block0/m{i}" for i in range(FIRST_CHARTS, PER_BLOCK)} <= set(fetched)
    assert not any(k.startswith(("block2/", "block9/")) for k in fetched)  # closed sections ask for nothing


def set_expanded(at: AppTest, label: str, expanded: bool) -> AppTest:
    """Open or close the expander titled ``label`` as the browser does: its state (an expander with
    a key and ``on_change`` is a widget) sent with the other widgets' on the next run, which calls
    its callback. AppTest has no control for an expander, hence its tree's widget states here."""
    box = next(e for e in at.expander if e.label == label)
    states = at._tree.get_widget_states()
    states.widgets.add(id=box.proto.id, bool_value=expanded)
    return at._run(states)


def test_closing_a_section_draws_nothing_of_it_and_keeps_it_closed(settings: Settings,
                                                                   sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        run_id = add_run(s, settings, "closing", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, last_step=20)
        s.flush()
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=step, key=key, value=1.0 + step,
                                           wall_time=time.time())
                                      for key in ("loss", "train/grad_norm", "sys/gpu_mem") for step in (10, 20)])
        s.commit()
    at = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    assert [chart_title(c) for c in metric_chart_elements(at)] == ["Loss", "sys/gpu_mem", "train/grad_norm"]
    set_expanded(at, "sys · 1 chart", False)
    no_exception(at)
    assert [chart_title(c) for c in metric_chart_elements(at)] == ["Loss", "train/grad_norm"]
    with sessions() as s:
        assert read_layout(s, panel_layout.folder_owner()).sections == {"sys": False}  # kept for the person
    again = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")  # a new browser session
    assert [chart_title(c) for c in metric_chart_elements(again)] == ["Loss", "train/grad_norm"]
    set_expanded(again, "sys · 1 chart", True)
    assert "sys/gpu_mem" in [chart_title(c) for c in metric_chart_elements(again)]
    with sessions() as s:
        assert read_layout(s, panel_layout.folder_owner()).sections == {"sys": True}
