"""``runyard settings``: the owner's settings file, ``settings.toml`` in the data folder.

    runyard settings show [--json]
    runyard settings set cost.electricity_usd_per_kwh=0.30 [cost.pue=1.2 ...]   (KEY= unsets a key)

The ``[cost]`` table is your own price: "Your cost" of every run (docs/COSTS.md). A key or value
that cannot be used exits with code 2 and names both; a file that cannot be read or written, with 1.
"""

from __future__ import annotations

import json
from typing import Any

import click

from db.vocabulary.settings import load_settings
from db.vocabulary.settings_file import (
    TABLES,
    SettingsFileError,
    parse_assignment,
    read_tables,
    settings_path,
    table_values,
    write_values,
)
from db.vocabulary.your_cost import OwnPrice
from orchestrator.cli.base import EXIT_USAGE, RunyardGroup, fail
from orchestrator.cost_text import own_price_text


@click.group(cls=RunyardGroup)
def settings() -> None:
    """Your settings: the [cost] table prices every run your way (docs/COSTS.md)."""


def _values() -> dict[str, dict[str, Any]]:
    home = load_settings().home
    try:
        return {table: table_values(home, table) for table in TABLES}
    except SettingsFileError as exc:
        fail(f"{exc}; `runyard settings set KEY=VALUE` rewrites a key")


@settings.command("show")
@click.option("--json", "as_json", is_flag=True)
def show(as_json: bool) -> None:
    """Every key of every table, with its value (its default where the file sets none)."""
    home = load_settings().home
    values = _values()
    price = OwnPrice.from_values(values["cost"])
    if as_json:
        click.echo(json.dumps({"file": str(settings_path(home)), **values,
                               "hardware_usd_per_gpu_hour": price.hardware_usd_per_gpu_hour}, indent=2))
        return
    written = read_tables(home)
    path = settings_path(home)
    click.echo(f"{path}" + ("" if path.exists() else " (not written yet: every key at its default)"))
    for table, keys in TABLES.items():
        click.echo(f"[{table}]")
        for key in keys:
            value = values[table][key.name]
            shown = "unset" if value is None else f"{value:g}"
            where = "" if key.name in written.get(table, {}) or value is None else " (default)"
            click.echo(f"  {key.name} = {shown}{where}    {key.doc}")
    click.echo(own_price_text(price))


@settings.command("set")
@click.argument("assignments", nargs=-1, required=True)
def set_(assignments: tuple[str, ...]) -> None:
    """Set keys: TABLE.KEY=VALUE (an empty VALUE unsets the key, back to its default)."""
    try:
        changes = {(table, name): value for table, name, value in map(parse_assignment, assignments)}
    except SettingsFileError as exc:
        fail(str(exc), EXIT_USAGE)
    try:
        write_values(load_settings().home, changes)
    except SettingsFileError as exc:
        fail(str(exc))
    for (table, name), value in changes.items():
        click.echo(f"{table}.{name} = {'unset' if value is None else f'{value:g}'}")
    click.echo(own_price_text(OwnPrice.from_values(_values()["cost"])))
