"""`runyard settings` (orchestrator/cli/settings.py): show and set the owner's settings file, and
exit 2 naming the key and the value when one cannot be used."""

from __future__ import annotations

import json

from click.testing import CliRunner

from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_set_then_show_gives_the_owners_cost_per_gpu_hour(settings: Settings) -> None:
    code, out, _ = run("settings", "set", "cost.electricity_usd_per_kwh=0.30", "cost.hardware_usd_per_gpu=8760",
                       "cost.hardware_life_years=1")
    assert code == 0, out
    assert "cost.electricity_usd_per_kwh = 0.3" in out
    assert "hardware $2.00 per GPU-hour" in out  # $8760 over 1 year x 4380 busy hours
    shown = json.loads(run("settings", "show", "--json")[1])
    assert shown["cost"]["electricity_usd_per_kwh"] == 0.30 and shown["cost"]["pue"] == 1.0
    assert shown["hardware_usd_per_gpu_hour"] == 2.0
    assert shown["file"] == str(settings.home / "settings.toml")
    text = run("settings", "show")[1]
    assert "pue = 1 (default)" in text and "electricity_usd_per_kwh = 0.3 " in text


def test_a_bad_value_exits_2_naming_key_and_value_and_writes_nothing(settings: Settings) -> None:
    code, _, err = run("settings", "set", "cost.electricity_usd_per_kwh=0.3", "cost.pue=0.9")
    assert code == 2
    assert "cost.pue = 0.9: must be at least 1" in err
    assert not (settings.home / "settings.toml").exists()  # all or nothing
    code, _, err = run("settings", "set", "cost.tarif=0.3")
    assert code == 2 and "cost.tarif: no such key" in err
