"""Each person's panel layout on the Run page (app/panels/layout.py), through the page as AppTest
opens it: pins, a closed section and the chart open full width outlast the browser session (a
new AppTest is a new one) and hold on another run; two people keep two layouts; a data folder
that cannot be written keeps a change for the session only, and one that cannot be read for a moment
never has the defaults saved over the person's layout; a UI run as a uid without a passwd entry has
a person all the same."""

from __future__ import annotations

import os
import pwd
import time
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError
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


def test_a_uid_without_a_passwd_entry_has_a_stable_name(settings: Settings, sessions: sessionmaker[Session],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``docker run -u 1234``: no passwd entry for the uid, no LOGNAME, USER, LNAME or USERNAME;
    getpass.getuser() raises (KeyError on 3.11 and 3.12, OSError from 3.13)."""
    run_id = _run_with(sessions, settings, "container")

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    assert panel_layout.folder_owner() == f"uid {os.getuid()}"
    at = open_page("views/run.py", run=str(run_id))
    at.button_group(key=f"pin-{run_id}").set_value(["lr"]).run()
    no_exception(at)
    assert _titles(at) == ["Learning rate"]
    with sessions() as s:
        assert read_layout(s, f"uid {os.getuid()}").pinned == ("lr",)  # kept under that name


def test_a_failed_read_leaves_the_stored_layout_intact(settings: Settings, sessions: sessionmaker[Session],
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    run_id = _run_with(sessions, settings, "locked")
    stored = Layout(pinned=("loss", "val/loss"), sections={"sys": False})
    with sessions() as s:
        save_layout(s, panel_layout.folder_owner(), stored)
        s.commit()

    def unreadable(*args: Any, **kwargs: Any) -> Layout:
        raise OperationalError("SELECT layout_json FROM panel_layouts", {}, Exception("database is locked"))

    monkeypatch.setattr(panel_layout, "read_layout", unreadable)
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert _titles(at) == ["Loss"]  # this session shows the defaults
    at.button_group(key=f"pin-{run_id}").set_value(["lr"]).run()
    no_exception(at)
    assert _titles(at) == ["Learning rate"]  # the change holds for the session
    with sessions() as s:
        assert read_layout(s, panel_layout.folder_owner()) == stored  # never the defaults saved over it
    assert "not saved" in caplog.text
    monkeypatch.undo()
    assert _titles(open_page("views/run.py", run=str(run_id))) == ["Loss", "val/loss"]  # the next session has it
