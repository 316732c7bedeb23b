"""The owner's settings file (db/vocabulary/settings_file.py): ``settings.toml`` written and read
back, private to its owner, the rest of the file kept, and a bad value named with its key."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from db.vocabulary.settings_file import (
    SettingsFileError,
    parse_assignment,
    read_tables,
    settings_path,
    table_values,
    write_values,
)


def test_an_absent_file_gives_every_default(tmp_path: Path) -> None:
    assert table_values(tmp_path, "cost") == {
        "electricity_usd_per_kwh": None, "pue": 1.0, "hardware_usd_per_gpu": None,
        "hardware_life_years": 4.0, "busy_hours_per_year": 4380.0}


def test_values_round_trip_in_a_private_file(tmp_path: Path) -> None:
    write_values(tmp_path, {("cost", "electricity_usd_per_kwh"): 0.30, ("cost", "pue"): 1.2})
    write_values(tmp_path, {("cost", "hardware_usd_per_gpu"): 30000.0})
    values = table_values(tmp_path, "cost")
    assert values["electricity_usd_per_kwh"] == 0.30 and values["pue"] == 1.2
    assert values["hardware_usd_per_gpu"] == 30000.0  # the second write kept the first's keys
    assert stat.S_IMODE(settings_path(tmp_path).stat().st_mode) == 0o600
    assert "[cost]" in settings_path(tmp_path).read_text()


def test_an_empty_value_unsets_a_key_back_to_its_default(tmp_path: Path) -> None:
    write_values(tmp_path, {("cost", "pue"): 1.5})
    write_values(tmp_path, {parse_assignment("cost.pue=")[:2]: None})
    assert table_values(tmp_path, "cost")["pue"] == 1.0
    assert read_tables(tmp_path) == {}  # an emptied table is not written


def test_another_concerns_table_is_kept(tmp_path: Path) -> None:
    settings_path(tmp_path).write_text('[team]\nname = "lab"\n')
    write_values(tmp_path, {("cost", "pue"): 1.1})
    assert read_tables(tmp_path)["team"] == {"name": "lab"}


@pytest.mark.parametrize(("text", "words"), [
    ("cost.pue=0.5", "cost.pue = 0.5: must be at least 1"),
    ("cost.pue=abc", "cost.pue = 'abc': not a number"),
    ("cost.electricity_usd_per_kwh=-0.1", "cost.electricity_usd_per_kwh = -0.1: must be at least 0"),
    ("cost.busy_hours_per_year=9000", "cost.busy_hours_per_year = 9000: must be at least 1 and at most 8,760"),
    ("cost.hardware_life_years=0", "cost.hardware_life_years = 0: must be at least 0.1 and at most 50"),
    # Tiny and huge values that pass "above 0" but divide by zero or overflow in every summary.
    ("cost.hardware_life_years=1e-320", "cost.hardware_life_years = 1e-320: must be at least 0.1 and at most 50"),
    ("cost.hardware_usd_per_gpu=1e308",
     "cost.hardware_usd_per_gpu = 1e+308: must be at least 0 and at most 10,000,000"),
    ("cost.electricity_usd_per_kwh=true", "cost.electricity_usd_per_kwh = True: not a number"),
    ("cost.tariff=0.3", "cost.tariff: no such key; [cost] holds electricity_usd_per_kwh"),
    ("power.pue=1", "[power]: no such table"),
    ("pue=1", "'pue=1': write TABLE.KEY=VALUE"),
])
def test_a_bad_assignment_names_the_key_and_the_value(text: str, words: str) -> None:
    with pytest.raises(SettingsFileError) as err:
        parse_assignment(text)
    assert words in str(err.value)


def test_a_bad_value_in_the_file_is_named_when_read(tmp_path: Path) -> None:
    settings_path(tmp_path).write_text('[cost]\npue = "high"\n')
    with pytest.raises(SettingsFileError, match=r"cost.pue = 'high': not a number"):
        table_values(tmp_path, "cost")
    settings_path(tmp_path).write_text("[cost\n")
    with pytest.raises(SettingsFileError, match="is not valid TOML"):
        table_values(tmp_path, "cost")


def test_a_misspelt_key_is_named_and_goes_with_the_next_write_or_by_name(tmp_path: Path) -> None:
    """A key written by hand with a typo makes the table unreadable (named); saving the table
    (Settings' Save, `runyard settings set cost.KEY=...`) writes it anew without the typo, and
    `cost.tarif=` unsets it by name."""
    settings_path(tmp_path).write_text("[cost]\ntarif = 0.3\n[other]\nkept = 1\n")
    with pytest.raises(SettingsFileError, match="tarif"):
        table_values(tmp_path, "cost")
    write_values(tmp_path, {("cost", "electricity_usd_per_kwh"): 0.3})
    assert table_values(tmp_path, "cost")["electricity_usd_per_kwh"] == 0.3
    assert read_tables(tmp_path)["other"] == {"kept": 1}  # another concern's table is not judged here
    settings_path(tmp_path).write_text("[cost]\ntarif = 0.3\n")
    write_values(tmp_path, {parse_assignment("cost.tarif=")[:2]: None})
    assert read_tables(tmp_path) == {}
    with pytest.raises(SettingsFileError, match="nope"):
        parse_assignment("nope.key=")
