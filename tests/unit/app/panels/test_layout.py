"""Each person's panel layout on the Run page (app/panels/layout.py), through the page as AppTest
opens it: pins, a closed section and the chart open full width outlast the browser session (a
new AppTest is a new one) and hold on another run; two people keep two layouts; a data folder
that cannot be written keeps a change for the session only."""

from __future__ import annotations

import pwd
import time
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.panels import layout as panel_layout
from app.server.asgi import PROXY_USER_KEY
from db.metricstore import write_points
from db.states import RunStatus
from db.vocabulary.settings import Settings
from db.workspace.layouts import Layout, read_layout, save_layout
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

KEYS = ("loss", "lr", "train/grad_norm", "train/tokens", "val/loss", "sys/gpu_mem")


def _run_with(sessions: sessionmaker[Session], settings: Settings, name: str) -> int:
    with sessions() as s:
        run_id = add_run(s, settings, name, RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, last_step=20)
        s.flush()
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=step, key=key, value=1.0 + step,
                                           wall_time=time.time()) for key in KEYS for step in (10, 20)])
        s.commit()
    return run_id


def _titles(at: Any) -> list[str]:
    return [chart_title(c) for c in metric_chart_elements(at)]


def test_pins_outlast_the_browser_session_and_hold_on_another_run(settings: Settings,
                                                                   sessions: sessionmaker[Session]) -> None:
    first, second = _run_with(sessions, settings, "first"), _run_with(sessions, settings, "second")
    at = open_page("views/run.py", run=str(first))
    assert _titles(at) == ["Loss"]  # no headline metric: the loss alone
    at.button_group(key=f"pin-{first}").set_value(["loss", "val/loss"]).run()
    no_exception(at)
    assert _titles(at) == ["Loss", "val/loss"]
    assert _titles(open_page("views/run.py", run=str(first))) == ["Loss", "val/loss"]  # a new browser session
    assert _titles(open_page("views/run.py", run=str(second))) == ["Loss", "val/loss"]  # and a new run


def test_a_closed_section_and_a_full_width_chart_outlast_the_session(settings: Settings,
                                                                     sessions: sessionmaker[Session]) -> None:
    run_id = _run_with(sessions, settings, "sections")
    at = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    assert [e.label for e in at.expander] == ["Charts · 2 charts", "val · 1 chart", "sys · 1 chart",
                                              "train · 2 charts"]  # the losses' sections first
    assert len(_titles(at)) == len(KEYS)
    with sessions() as s:  # the person closed "sys" (the expander's callback, which AppTest cannot click)
        save_layout(s, panel_layout.folder_owner(), Layout(sections={"sys": False}))
        s.commit()
    at = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    assert "GPU memory" not in " ".join(_titles(at)) and len(_titles(at)) == len(KEYS) - 1
    at.button(key=f"full-metrics-{run_id}-train/tokens").click().run()
    no_exception(at)
    assert "train/grad_norm" not in _titles(at) and "train/tokens" in _titles(at)
    assert len(_titles(at)) == len(KEYS) - 2  # train's other chart gives way; the other sections stay
    again = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    assert "train/grad_norm" not in _titles(again) and "train/tokens" in _titles(again)
    again.button(key=f"full-metrics-{run_id}-train/tokens").click().run()  # "Back to all charts"
    assert "train/grad_norm" in _titles(again)
    with sessions() as s:
        assert read_layout(s, panel_layout.folder_owner()) == Layout(sections={"sys": False})


def test_two_people_keep_two_layouts(settings: Settings, sessions: sessionmaker[Session],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _run_with(sessions, settings, "shared")
    monkeypatch.setattr(panel_layout, "_user", lambda name: "alice" if name == PROXY_USER_KEY else None)
    at = open_page("views/run.py", run=str(run_id))
    at.button_group(key=f"pin-{run_id}").set_value(["sys/gpu_mem"]).run()
    monkeypatch.setattr(panel_layout, "_user", lambda name: "bob" if name == PROXY_USER_KEY else None)
    assert _titles(open_page("views/run.py", run=str(run_id))) == ["Loss"]
    with sessions() as s:
        assert read_layout(s, "alice").pinned == ("sys/gpu_mem",) and read_layout(s, "bob") == Layout()


def test_the_data_folder_owner_is_the_person_without_a_proxy_or_sign_on(settings: Settings) -> None:
    assert panel_layout.folder_owner() == pwd.getpwuid(settings.home.stat().st_uid).pw_name
