"""The owner's settings file: ``settings.toml`` in the data folder, one TOML table per concern.

``[cost]`` holds the owner's own price (docs/COSTS.md, "Your cost and the cloud reference"); a
later concern adds its table to :data:`TABLES` and nothing else changes. Every process reads the
file; `runyard settings set` and the Settings page write it whole, under a lock, through a
temporary file renamed over it (mode 0600: like ``alerts.json``, it is the owner's business).
A value that cannot be used names its key and the value and says what to do.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from db import DatabaseError
from db.vocabulary.config.writing import toml_document
from db.vocabulary.layout import SETTINGS_FILE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class SettingsFileError(DatabaseError):
    """``settings.toml`` cannot be read, or a value cannot be used (the message names the key and value)."""


def _number(value: float) -> str:
    """A bound as a person writes it: 10,000,000 and 0.1, not 1e+07."""
    return f"{int(value):,}" if value == int(value) else f"{value:g}"


@dataclass(frozen=True)
class Key:
    """One number a table of the settings file holds.

    Attributes:
        name: The key inside its table (``electricity_usd_per_kwh``).
        doc: What it means, with its unit (shown by `runyard settings show` and the Settings page).
        default: Its value when the file does not set it (None: unset).
        minimum: The smallest value it takes.
        maximum: The largest value it takes (None: no limit).
        above_minimum: Whether the value must be strictly above ``minimum``.
    """

    name: str
    doc: str
    default: float | None = None
    minimum: float = 0.0
    maximum: float | None = None
    above_minimum: bool = False

    def check(self, table: str, value: object) -> float:
        """``value`` as this key's number.

        Raises:
            SettingsFileError: naming ``table.name`` and the value, and what it must be.
        """
        where = f"{table}.{self.name} = {value!r}"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SettingsFileError(f"{where}: not a number; give one, as in `runyard settings set "
                                    f"{table}.{self.name}={self.example}`")
        low = value <= self.minimum if self.above_minimum else value < self.minimum
        if low or (self.maximum is not None and value > self.maximum):
            bound = f"above {_number(self.minimum)}" if self.above_minimum else f"at least {_number(self.minimum)}"
            if self.maximum is not None:
                bound += f" and at most {_number(self.maximum)}"
            raise SettingsFileError(f"{where}: must be {bound}; {self.doc}")
        return float(value)

    @property
    def example(self) -> str:
        """A value this key takes, for messages."""
        return f"{self.default:g}" if self.default is not None else "1"


HOURS_PER_YEAR = 8760.0
# Bounds a person's real numbers sit well inside, so that the arithmetic stays finite (a life of
# 1e-320 years would divide by zero in every summary).
COST_KEYS = (
    Key("electricity_usd_per_kwh", "the electricity tariff, USD per kWh (unset: your cost is not shown)",
        maximum=100.0),
    Key("pue", "power usage effectiveness: the energy the room draws over what the devices measure "
        "(cooling, power supplies); 1.0 counts the devices' energy alone", default=1.0, minimum=1.0, maximum=5.0),
    Key("hardware_usd_per_gpu", "what one GPU cost, USD (a machine without GPU: the whole machine, shared "
        "by its slots; unset: no hardware part)", maximum=1e7),
    Key("hardware_life_years", "the years the hardware is written off over", default=4.0, minimum=0.1,
        maximum=50.0),
    Key("busy_hours_per_year", "the hours a year the hardware trains", default=4380.0, minimum=1.0,
        maximum=HOURS_PER_YEAR),
)
# Every table the file may hold, with its keys; a new concern adds its own.
TABLES: dict[str, tuple[Key, ...]] = {"cost": COST_KEYS}


def settings_path(home: Path) -> Path:
    """Where the settings file of the data folder ``home`` is."""
    return Path(home) / SETTINGS_FILE


def _key(table: str, name: str) -> Key:
    if table not in TABLES:
        raise SettingsFileError(f"[{table}]: no such table in {SETTINGS_FILE}; the tables are "
                                f"{', '.join(sorted(TABLES))}")
    for key in TABLES[table]:
        if key.name == name:
            return key
    raise SettingsFileError(f"{table}.{name}: no such key; [{table}] holds "
                            f"{', '.join(k.name for k in TABLES[table])}")


def read_tables(home: Path) -> dict[str, dict[str, Any]]:
    """The file's tables as written (no defaults filled in); none when the file is absent.

    Raises:
        SettingsFileError: the file cannot be read or is not TOML (naming the file and the fault).
    """
    path = settings_path(home)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsFileError(f"{path} cannot be read: {exc}") from None
    try:
        data: dict[str, Any] = tomllib.loads(text)  # tomli (under 3.10) is checked as untyped
    except tomllib.TOMLDecodeError as exc:
        raise SettingsFileError(f"{path} is not valid TOML ({exc}); correct it, or remove it to start "
                                "from the defaults") from None
    for name, table in data.items():
        if not isinstance(table, dict):
            raise SettingsFileError(f"{path}: {name} = {table!r} is not a table; write it as [{name}]")
    return data


def table_values(home: Path, table: str) -> dict[str, float | None]:
    """Every key of ``table`` with its value: the file's, checked, else the key's default.

    Raises:
        SettingsFileError: the file cannot be read, or a key of the table is unknown or holds a value
            it cannot take.
    """
    written = read_tables(home).get(table, {})
    for name in written:
        _key(table, name)
    return {k.name: k.check(table, written[k.name]) if k.name in written else k.default for k in TABLES[table]}


def parse_assignment(text: str) -> tuple[str, str, float | None]:
    """``"cost.pue=1.2"`` as (table, key, value); an empty value (``cost.pue=``) unsets the key.

    Raises:
        SettingsFileError: not ``TABLE.KEY=VALUE``, an unknown table or key, or a value the key
            cannot take (naming the key and the value).
    """
    dotted, eq, raw = text.partition("=")
    table, dot, name = dotted.strip().partition(".")
    if not eq or not dot:
        raise SettingsFileError(f"{text!r}: write TABLE.KEY=VALUE, as in `cost.electricity_usd_per_kwh=0.30`")
    raw = raw.strip()
    if not raw and table in TABLES:
        return table, name, None  # unset, a misspelt key too (write_values)
    key = _key(table, name)
    try:
        value: object = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # not a TOML value: the key's check names it
    return table, name, key.check(table, value)


def write_values(home: Path, changes: Mapping[tuple[str, str], float | None]) -> dict[str, dict[str, Any]]:
    """Set (or, for None, unset) each (table, key) of ``changes`` in the settings file, keeping the
    rest of it; the file is replaced whole, mode 0600, under an exclusive lock. A table written to
    loses the keys it does not know (a misspelt one, which made the file unreadable), and such a
    key may be unset by name (``cost.tarif=``).

    Returns:
        The file's tables as now written.

    Raises:
        SettingsFileError: a key or value cannot be used, or the file cannot be read or written.
    """
    from filelock import FileLock  # noqa: PLC0415 - only to write: a reader need not import it

    path = settings_path(home)
    for (table, name), value in changes.items():
        if value is not None:
            _key(table, name).check(table, value)
        elif table not in TABLES:
            _key(table, name)  # names the tables there are
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(path.with_name(f".{SETTINGS_FILE}.lock"), mode=0o600):
            tables = read_tables(home)
            for (table, name), value in changes.items():
                entries = tables.setdefault(table, {})
                if value is None:
                    entries.pop(name, None)
                else:
                    entries[name] = value
            for table in {table for table, _ in changes}:
                known = {key.name for key in TABLES[table]}
                tables[table] = {name: v for name, v in tables.get(table, {}).items() if name in known}
            tables = {t: entries for t, entries in tables.items() if entries}
            tmp = path.with_name(f".{SETTINGS_FILE}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(toml_document(tables) + "\n")
            os.chmod(tmp, 0o600)  # an older file of that name kept its mode through O_TRUNC
            os.replace(tmp, path)
    except OSError as exc:
        raise SettingsFileError(f"{path} cannot be written: {exc}; check the data folder's permissions "
                                "and free space") from None
    return tables
