"""`runyard alerts` (orchestrator/cli/alerts.py): add, test, history and rm, through click's runner
against a local receiver.
"""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy.orm import Session, sessionmaker

from db.vocabulary.settings import Settings
from orchestrator.alerts.engine import history
from orchestrator.alerts.store import AlertStore
from orchestrator.cli.group import cli
from tests.alert_receivers import http_receiver
from tests.unit.orchestrator.alerts.alert_runs import deliveries, drain, engine_and_worker
from tests.unit.orchestrator.fake_runs import make_scheduler, queue, status, tick_until

__all__ = ["deliveries"]  # the fixtures, from the helper module


def test_cli_add_test_history_and_rm(sessions: sessionmaker[Session], settings: Settings) -> None:
    env = {"RUNYARD_HOME": str(settings.home), "RUNYARD_DB_URL": settings.db_url}
    runner = CliRunner()
    with http_receiver() as receiver:
        added = runner.invoke(cli, ["alerts", "add", receiver.url("runyard+http", "/hook"), "--on", "failed"], env=env)
        assert added.exit_code == 0, added.output
        assert "channel 1 added: runyard+http://127.0.0.1:" in added.output and "signing secret" in added.output
        down = runner.invoke(cli, ["alerts", "add", "json://127.0.0.1:9/x"], env=env)
        assert down.exit_code == 0
        tested = runner.invoke(cli, ["alerts", "test"], env=env)
        assert len(receiver.posts) == 1
    assert tested.exit_code == 1
    assert "channel 1 runyard+http://127.0.0.1:" in tested.output and ": delivered" in tested.output
    assert "channel 2 json://127.0.0.1:9/***: failed" in tested.output and "1 of 2 channel(s) failed" in tested.output
    bad = runner.invoke(cli, ["alerts", "add", "json://x", "--on", "nope"], env=env)
    assert bad.exit_code == 2 and "nope" in bad.output
    assert runner.invoke(cli, ["alerts", "rm", "2"], env=env).exit_code == 0
    assert "json://127.0.0.1:9" not in runner.invoke(cli, ["alerts", "ls"], env=env).output
    run_id = queue(sessions, settings, "fails", retry={"max_retries": 0})
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, run_id) == "FAILED")
    engine, worker = engine_and_worker(sessions, settings)
    with http_receiver() as receiver:
        store = AlertStore(settings.home)
        channel = store.remove(1)
        store.add(receiver.url("runyard+http", "/hook"), on=channel.on)
        engine.evaluate()
        drain(worker)
    shown = runner.invoke(cli, ["alerts", "history", str(run_id), "--json"], env=env)
    assert shown.exit_code == 0
    (alert,) = json.loads(shown.output)
    assert alert["trigger"] == "failed" and alert["run_id"] == run_id
    assert [(d["kind"], d["status"]) for d in alert["deliveries"]] == [("fire", "delivered")]
    with sessions() as s:
        assert history(s, run_id)[0]["deliveries"][0]["channel"].startswith("runyard+http://127.0.0.1:")
