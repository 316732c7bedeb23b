"""The channel file (orchestrator/alerts/store.py): kept 0600, shown masked, its writers take turns
under one lock, and the channels a run's config names must be there (issue 52, item 13: the
error lists them), at submit from the CLI and the UI, and in a fork.
"""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest
from click.testing import CliRunner
from sqlalchemy.orm import Session, sessionmaker

from db.vocabulary.config import ConfigError, parse_config
from db.vocabulary.settings import Settings
from orchestrator.alerts import AlertsError
from orchestrator.alerts.store import AlertStore, mask_url
from orchestrator.cli.group import cli
from orchestrator.submission import submit, validate
from tests.unit.orchestrator.fake_runs import CPU2
from tests.unit.paths import ROOT


def test_channel_urls_are_kept_0600_and_shown_masked(settings: Settings) -> None:
    store = AlertStore(settings.home)
    channel = store.add("json://user:hunter22@hooks.example.com/T0KEN123/abc?token=zzsecret")
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert channel.masked == "json://user:***@hooks.example.com/***?token=***"
    assert mask_url("slack://TokenA1/TokenB2/TokenC3") == "slack://tok***/***"
    runner = CliRunner()
    listed = runner.invoke(cli, ["alerts", "ls"], env={"RUNYARD_HOME": str(settings.home)})
    assert listed.exit_code == 0 and "hooks.example.com" in listed.output
    assert "hunter22" not in listed.output and "T0KEN123" not in listed.output and "zzsecret" not in listed.output
    with pytest.raises(AlertsError, match="does not understand"):
        store.add("nosuchscheme://x")


def test_writers_of_the_channel_file_take_turns(settings: Settings) -> None:
    """Each writer reads, changes and replaces alerts.json under one exclusive lock (filelock, as
    the scheduler's and the migration's locks): writers at once lose no channel."""
    def add_some(n: int) -> None:
        store = AlertStore(settings.home)  # a store of its own, as each process has
        for i in range(5):
            store.add(f"json://hooks.example.com/writer{n}/{i}")

    threads = [threading.Thread(target=add_some, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    channels = AlertStore(settings.home).load().channels
    assert len(channels) == 20 and len({c.id for c in channels}) == 20
    lock = settings.home / ".alerts.json.lock"
    assert not lock.exists() or stat.S_IMODE(lock.stat().st_mode) == 0o600


EXAMPLE = str(ROOT / "examples" / "digits.toml")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_alert_channels_of_a_config_must_exist(settings: Settings, sessions: sessionmaker[Session]) -> None:
    code, _, err = run("submit", EXAMPLE, "--set", 'alerts.channels=["99"]')
    assert code == 2 and "alerts.channels = ['99']: no channel 99; there are no channels yet" in err
    store = AlertStore(settings.home)
    store.add("json://hooks.example.com/a")
    store.add("ntfy://ntfy.sh/runs")
    with pytest.raises(ConfigError) as refused:  # the UI's path: validate with the data folder
        validate({"alerts": {"channels": ["1", "99"]}}, CPU2, channels=store.config_problems)
    assert str(refused.value).count("no channel") == 1
    assert ("alerts.channels = ['1', '99']: no channel 99; the channels: 1: json://hooks.example.com/***; "
            "2: ntfy://ntfy.sh/*** (`runyard alerts ls`)") in str(refused.value)
    with pytest.raises(ConfigError, match="no channel 99"):  # and submit itself, whoever validated before
        submit(sessions, settings, parse_config({"alerts": {"channels": ["99"]}}), CPU2, channels=store.config_problems)
    code, out, err = run("submit", EXAMPLE, "--set", 'alerts.channels=["2"]')
    assert code == 0 and out.strip() == "1", err
    # A channel written before hosts were checked (by hand here) cannot be named by a new run.
    data = json.loads(store.path.read_text())
    data["channels"].append({"id": 3, "url": "json://2852039166/", "on": [], "secret": None, "allow": []})
    store.path.write_text(json.dumps(data))
    code, _, err = run("submit", EXAMPLE, "--set", 'alerts.channels=["3"]')
    assert code == 2 and "channel 3 cannot be used" in err and "169.254.169.254, a cloud metadata address" in err
