"""The alert engine (orchestrator/alerts/engine.py): an alert still true is sent again after its
repeat interval and quiet hours defer it, and a channel's ``--on`` (issue 52, item 13) gets what
the defaults leave off.
"""

from __future__ import annotations

import time

from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import AlertDelivery, Attempt, Run
from db.vocabulary.settings import Settings
from orchestrator.alerts.engine import AlertEngine, in_quiet_hours
from orchestrator.alerts.store import AlertStore
from orchestrator.cli.group import cli
from tests.unit.orchestrator.alerts.alert_runs import cancel, deliveries, engine_and_worker, running_attempt
from tests.unit.orchestrator.fake_runs import make_scheduler, queue, status, tick_until


def test_a_still_true_alert_repeats_after_the_interval_and_quiet_hours_defer(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    store = AlertStore(settings.home)
    store.add("json://127.0.0.1:9/never")
    run_id, scheduler = running_attempt(sessions, settings, alerts={"repeat_s": 600, "stalled_min_s": 60})
    engine, _ = engine_and_worker(sessions, settings)
    now = time.time()
    with sessions() as s:
        run, attempt = s.get_one(Run, run_id), s.get_one(Attempt, 1)
        run.status = "RUNNING"
        attempt.first_step_at, attempt.progress_at = now - 400, now - 300
        s.commit()
    assert [a.trigger for a in engine.evaluate(now)] == ["stalled"]
    assert engine.evaluate(now + 300) == []
    assert [a.repeats for a in engine.evaluate(now + 601)] == [1]
    kinds = [(d.kind, d.next_at) for d in deliveries(sessions)]
    assert [k for k, _ in kinds] == ["fire", "repeat"]
    cancel(sessions, scheduler, run_id)
    # Quiet hours: 23:00-07:00 holds 02:00 (until 07:00 that day), not 12:00; urgent triggers skip them.
    two_am = time.mktime((2026, 11, 27, 2, 0, 0, 0, 0, -1))
    assert in_quiet_hours("23:00-07:00", two_am) == time.mktime((2026, 11, 27, 7, 0, 0, 0, 0, -1))
    assert in_quiet_hours("23:00-07:00", two_am + 10 * 3600) is None
    assert in_quiet_hours("", two_am) is None


def test_a_channel_on_finished_gets_it_while_the_defaults_leave_it_off(sessions: sessionmaker[Session],
                                                                        settings: Settings) -> None:
    """`runyard alerts add URL --on finished` is what a person asks for: that channel gets every
    run's success, though the defaults leave `finished` off; a channel without --on still follows
    the defaults, and a run's [alerts] off still wins. `alerts add` says so."""
    store = AlertStore(settings.home)
    store.add("json://hooks.example.com/all")
    added = CliRunner().invoke(cli, ["alerts", "add", "json://hooks.example.com/done", "--on", "finished"],
                               env={"RUNYARD_HOME": str(settings.home)})
    assert added.exit_code == 0, added.output
    assert "note: finished is off in the defaults: channel 2 gets it all the same, the other channels do not" \
        in added.stderr
    told = queue(sessions, settings, "quick")
    hushed = queue(sessions, settings, "quick", alerts={"off": ["finished"]})
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, told) == status(sessions, hushed) == "SUCCEEDED")
    (alert,) = AlertEngine(sessions, settings.home).evaluate()
    assert (alert.run_id, alert.trigger) == (told, "finished")
    with sessions() as s:
        queued = [(d.channel_id, d.run_id, d.trigger) for d in s.scalars(select(AlertDelivery))]
    assert queued == [(2, told, "finished")]  # not channel 1 (defaults), not the run that turned it off
