"""The dashboard's alerts, rendered by Streamlit's AppTest on a real database (as in
tests/unit/app/pages.py): Settings' Alerts part adds a channel and its Test button delivers to a local
receiver; the Run page lists a run's alerts with their delivery state; the Runs list marks a run
with an open alert."""

from __future__ import annotations

import json

from sqlalchemy.orm import Session, sessionmaker

from db.models import Alert, AlertDelivery
from db.states import RunStatus
from db.vocabulary.settings import Settings
from orchestrator.alerts.store import AlertStore
from tests.alert_receivers import http_receiver
from tests.unit.app.pages import add_failed_run, add_run, no_exception, open_page, sessions, settings

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module


def test_settings_adds_a_channel_and_its_test_button_delivers(settings: Settings,
                                                              sessions: sessionmaker[Session]) -> None:
    at = open_page("views/settings.py")
    no_exception(at)
    assert "No channels yet: add one below." in [i.value for i in at.info]
    with http_receiver() as receiver:
        at.text_input(key="alert_url").set_value(receiver.url("runyard+http", "/hook"))
        next(b for b in at.button if b.label == "Add channel").click().run()
        no_exception(at)
        (channel,) = AlertStore(settings.home).load().channels
        assert any(f"Channel {channel.id} added: runyard+http://127.0.0.1:{receiver.port}/***" in s.value
                   for s in at.success)
        at.run()
        table = at.dataframe[1].value  # prices, then the channels
        assert list(table["channel"]) == [channel.masked] and channel.secret is not None
        assert channel.secret not in json.dumps(list(table["channel"]))
        at.button(key="alert_test").click().run()
        no_exception(at)
        assert len(receiver.posts) == 1 and receiver.posts[0].json["kind"] == "test"
    assert any(": delivered" in s.value for s in at.success)
    at.multiselect(key="alert_default_triggers").set_value(["failed", "hang"])
    at.text_input(key="alert_quiet").set_value("25:00-07:00")
    next(b for b in at.button if b.label == "Save defaults").click().run()
    assert any("quiet_hours = '25:00-07:00': expected HH:MM-HH:MM" in e.value.replace("\\", "") for e in at.error)
    at.text_input(key="alert_quiet").set_value("22:00-07:00")
    next(b for b in at.button if b.label == "Save defaults").click().run()
    defaults = AlertStore(settings.home).load().defaults
    assert defaults.triggers == ("failed", "hang") and defaults.quiet_hours == "22:00-07:00"


def test_run_page_shows_its_alerts_and_the_runs_list_marks_open_ones(settings: Settings,
                                                                     sessions: sessionmaker[Session]) -> None:
    failed = add_failed_run(sessions, settings, "ValueError: bad", "tail")
    with sessions() as s:
        quiet = add_run(s, settings, "quiet", RunStatus.STARTING, RunStatus.RUNNING)
        alert = Alert(key=f"run:{failed}:failed:1", run_id=failed, trigger="failed", state="open",
                      message=f"run {failed} (broken) failed: USER_ERROR on rank 1", opened_at=1.0, sent_at=1.0)
        s.add(alert)
        s.flush()
        s.add_all([AlertDelivery(alert_id=alert.id, run_id=failed, channel_id=1, channel="json://h/***", kind="fire",
                                 trigger="failed", message="m", status="delivered", tries=1, created_at=1.0,
                                 next_at=1.0),
                   AlertDelivery(alert_id=alert.id, run_id=failed, channel_id=2, channel="ntfy://x/***", kind="fire",
                                 trigger="failed", message="m", status="failed", tries=4, error="HTTP 500",
                                 created_at=1.0, next_at=1.0)])
        s.commit()
    at = open_page("views/runs.py")
    no_exception(at)
    table = at.dataframe[0].value
    marks = dict(zip(table["id"], table["alert"], strict=True))
    assert marks == {failed: "! failed", quiet: ""}
    at = open_page("views/run.py", run=str(failed))
    no_exception(at)
    expander = next(e for e in at.expander if e.label.startswith("Alerts"))
    assert expander.label == "Alerts (1, 1 open)"
    (row,) = expander.dataframe[0].value.to_dict("records")
    assert row["trigger"] == "failed" and row["state"] == "open"
    assert row["delivery"] == "delivered 1, failed 1 (HTTP 500)"


def test_settings_refuses_a_channel_to_the_metadata_address_in_any_spelling(settings: Settings) -> None:
    """Issue 52, item 7: Settings → Alerts refuses what `runyard alerts add` refuses, when it is
    added (169.254.169.254 written as one number here), and adds nothing."""
    at = open_page("views/settings.py")
    at.text_input(key="alert_url").set_value("json://2852039166/")
    next(b for b in at.button if b.label == "Add channel").click().run()
    no_exception(at)
    assert any("2852039166 is 169.254.169.254, a cloud metadata address; refused" in e.value.replace("\\", "")
               for e in at.error), [e.value for e in at.error]
    assert AlertStore(settings.home).load().channels == ()
