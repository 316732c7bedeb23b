"""The Settings page (app/views/settings.py): your cost's settings saved to settings.toml with what
they make of a GPU-hour, and the price table: shown, saved for new runs only, and a negative price
refused.
"""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app import data
from db import queries, run_list
from db.requests import RequestRefused, set_prices
from db.vocabulary.config import RunConfig
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from db.vocabulary.settings_file import settings_path, table_values
from orchestrator.submission import submit
from tests.unit.app.pages import as_read, no_exception, open_page, sessions, settings

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module


# -- Settings page --------------------------------------------------------------------------


def test_settings_page_shows_the_price_table(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        set_prices(s, {"cpu-node": 0.5, "H100": 3.5})
        s.commit()
    at = open_page("views/settings.py")
    no_exception(at)
    table = at.dataframe[0].value
    assert dict(zip(table["device"], table["usd_per_hour"], strict=True)) == {"H100": 3.5, "cpu-node": 0.5}
    assert "Save prices" in [b.label for b in at.button]


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_edited_prices_apply_to_new_runs_only(settings: Settings, sessions: sessionmaker[Session]) -> None:
    """The price is snapshotted at submit: editing the table (what the Settings page's Save
    does) changes new runs, not submitted ones. AppTest cannot edit a data_editor's cells, so
    the save is called directly."""
    cpu = Inventory(kind="cpu", slots=2)
    submit(sessions, settings, RunConfig(name="before"), cpu)
    assert data_module().save_prices({"cpu-node": 0.50, "H100": 3.50}) is None
    submit(sessions, settings, RunConfig(name="after"), cpu)
    with sessions() as s:
        by_name = {r["name"]: r for r in run_list.list_runs(s)}
        assert queries.price_table(s) == {"cpu-node": 0.50, "H100": 3.50}
    assert by_name["before"]["price_usd_per_hour"] == pytest.approx(0.10)  # 2 of 2 slots at the default $0.10
    assert by_name["after"]["price_usd_per_hour"] == pytest.approx(0.50)


def data_module():
    return data


def test_negative_price_is_refused(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, pytest.raises(RequestRefused, match="non-negative"):
        set_prices(s, {"cpu-node": -1.0})


# -- Your cost ------------------------------------------------------------------------------


def test_your_cost_is_saved_to_the_settings_file_with_its_cost_per_gpu_hour(settings: Settings) -> None:
    at = open_page("views/settings.py")
    no_exception(at)
    assert "no electricity tariff set" in at.info[0].value
    assert at.number_input(key="cost_pue").value == 1.0  # the default, stated
    at.number_input(key="cost_electricity_usd_per_kwh").set_value(0.30)
    at.number_input(key="cost_hardware_usd_per_gpu").set_value(8760.0)
    at.number_input(key="cost_hardware_life_years").set_value(1.0)
    at.button(key="FormSubmitter:your_cost-Save your cost").click().run()
    no_exception(at)
    assert table_values(settings.home, "cost")["electricity_usd_per_kwh"] == 0.30
    shown = as_read(at.info[0].value)
    assert "hardware $2.00 per GPU-hour" in shown and "energy at $0.30/kWh x PUE 1.0" in shown


def test_a_bad_value_in_the_file_is_named_on_the_page(settings: Settings) -> None:
    settings_path(settings.home).write_text("[cost]\npue = 0.5\n")
    at = open_page("views/settings.py")
    no_exception(at)
    assert "cost.pue = 0.5: must be at least 1" in as_read(at.error[0].value)
