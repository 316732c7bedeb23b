"""The channel file (orchestrator/alerts/store.py): kept 0600, shown masked, and its writers take
turns under one lock.
"""

from __future__ import annotations

import os
import stat
import threading

import pytest
from click.testing import CliRunner

from db.vocabulary.settings import Settings
from orchestrator.alerts import AlertsError
from orchestrator.alerts.store import AlertStore, mask_url
from orchestrator.cli.group import cli


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
