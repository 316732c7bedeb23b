"""Your cost: what a run costs its owner, beside the cloud reference (docs/COSTS.md).

Two lines, never mixed. **Your cost** = the run's energy (kWh) x the electricity tariff x PUE, plus
its device-hours x the hardware's amortisation (the hardware's price over its life's busy hours),
from the ``[cost]`` table of the settings file as it is today (every run priced the owner's way).
**Cloud reference** = the device-hours x the list price the run was submitted at (the price table
of db/vocabulary/cost.py, snapshotted on the run): the summary's flat ``cost_usd`` keys.
Each line has its wasted part (the device time :func:`~db.vocabulary.cost.wasted_seconds` counts:
lost work, restarts) and, while the run goes on, its projected total.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from db.vocabulary.cost import AttemptSpan, wasted_seconds
from db.vocabulary.settings_file import SettingsFileError, table_values

NO_TARIFF = ("no electricity tariff set: set yours in Settings "
             "(`runyard settings set cost.electricity_usd_per_kwh=0.30`)")
ENERGY_NOT_MEASURED = "energy not measured: the hardware part only"


@dataclass(frozen=True)
class OwnPrice:
    """The owner's price, the ``[cost]`` table of the settings file (db/vocabulary/settings_file.py)."""

    electricity_usd_per_kwh: float | None = None
    pue: float = 1.0
    hardware_usd_per_gpu: float | None = None
    hardware_life_years: float = 4.0
    busy_hours_per_year: float = 4380.0

    @classmethod
    def from_values(cls, values: Mapping[str, float | None]) -> OwnPrice:
        """From the ``[cost]`` table's values (defaults filled in)."""
        return cls(electricity_usd_per_kwh=values["electricity_usd_per_kwh"], pue=values["pue"] or 1.0,
                   hardware_usd_per_gpu=values["hardware_usd_per_gpu"],
                   hardware_life_years=values["hardware_life_years"] or 4.0,
                   busy_hours_per_year=values["busy_hours_per_year"] or 4380.0)

    @property
    def hardware_usd_per_gpu_hour(self) -> float:
        """The hardware's cost per GPU-hour (per machine-hour on a machine without GPU): its price
        over its life's busy hours; 0 while no hardware price is set."""
        if self.hardware_usd_per_gpu is None:
            return 0.0
        return self.hardware_usd_per_gpu / (self.hardware_life_years * self.busy_hours_per_year)


def own_price(home: Path) -> OwnPrice | str:
    """The owner's price from the settings file of ``home``, or why it cannot be read (a sentence
    naming the key and value): a page or a summary shows that instead of a number."""
    try:
        return OwnPrice.from_values(table_values(home, "cost"))
    except SettingsFileError as exc:
        return str(exc)


def devices_held(price_unit: str, nproc: int) -> float:
    """How many GPUs' hardware a run holds, read from the unit its price was snapshotted with:
    its GPUs; on a machine without GPU its share of the machine (2 of 16 slots: 0.125); a Slurm
    job without GPUs, its nodes (each counted as one machine)."""
    if m := re.match(r"(\d+)/(\d+) of a CPU node", price_unit):
        return int(m[1]) / max(1, int(m[2]))
    if m := re.match(r"(\d+) (?:x |Slurm GPU|Slurm node)", price_unit):
        return float(m[1])
    return float(nproc)


def _seconds(span: AttemptSpan, now: float) -> float:
    return max(0.0, (span.ended_at if span.ended_at is not None else now) - span.started_at)


def spread_energy(kwh: float | None, spans: Sequence[AttemptSpan], now: float) -> list[float | None]:
    """A run's energy shared among its attempts by their time (when only the run's total is known)."""
    total = sum(_seconds(s, now) for s in spans)
    if kwh is None:
        return [None] * len(spans)
    return [kwh * _seconds(s, now) / total if total > 0 else 0.0 for s in spans]


def your_cost(spans: Sequence[AttemptSpan], kwh: Sequence[float | None], devices: float, price: OwnPrice,
              eta_s: float | None, now: float) -> dict[str, Any]:
    """The "Your cost" line of a run.

    Args:
        spans: The run's attempts, oldest first.
        kwh: Each attempt's energy (None: not measured).
        devices: The GPUs the run holds (:func:`devices_held`).
        price: The owner's price.
        eta_s: Seconds until the run ends while it goes on (None: finished, or no estimate).
        now: The time a running attempt is counted up to.

    Returns:
        ``usd``, ``wasted_usd``, ``projected_usd`` (None, with ``reason`` saying why, while no
        tariff is set), the parts ``energy_usd`` (None when energy is not measured) and
        ``hardware_usd``, ``energy_kwh``, the prices used, and ``note`` (energy not measured).
    """
    tariff = price.electricity_usd_per_kwh
    hourly = price.hardware_usd_per_gpu_hour * devices
    measured = [e for e in kwh if e is not None]
    energy_kwh = sum(measured) if measured else None
    line: dict[str, Any] = {
        "usd": None, "wasted_usd": None, "projected_usd": None, "energy_usd": None, "hardware_usd": None,
        "energy_kwh": energy_kwh, "usd_per_kwh": tariff, "pue": price.pue,
        "hardware_usd_per_gpu_hour": price.hardware_usd_per_gpu_hour, "devices": devices,
        "reason": None, "note": None if energy_kwh is not None else ENERGY_NOT_MEASURED,
    }
    if tariff is None:
        return line | {"reason": NO_TARIFF}
    usd_per_kwh = tariff * price.pue
    seconds = [_seconds(s, now) for s in spans]
    hardware = sum(seconds) * hourly / 3600.0
    energy = energy_kwh * usd_per_kwh if energy_kwh is not None else None
    wasted = 0.0
    for span, held, e in zip(spans, seconds, kwh, strict=True):
        lost = wasted_seconds([span], now)
        wasted += lost * hourly / 3600.0
        if e is not None and held > 0:  # the attempt's energy spread evenly over its time
            wasted += e * lost / held * usd_per_kwh
    total = hardware + (energy or 0.0)
    projected = total
    if eta_s is not None:
        # The rest at this run's pace of spending: its hardware share, and its mean power so far.
        power_kw = energy_kwh / (sum(seconds) / 3600.0) if energy_kwh and sum(seconds) > 0 else 0.0
        projected += eta_s / 3600.0 * (hourly + power_kw * usd_per_kwh)
    return line | {"usd": round(total, 6), "wasted_usd": round(wasted, 6), "projected_usd": round(projected, 6),
                   "energy_usd": round(energy, 6) if energy is not None else None,
                   "hardware_usd": round(hardware, 6)}


def cloud_reference(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The "Cloud reference" line of a run summary: its flat cost keys, under names of their own."""
    return {"usd": summary["cost_usd"], "wasted_usd": summary["cost_wasted_usd"],
            "projected_usd": summary["cost_projected_usd"], "usd_per_hour": summary["price_usd_per_hour"],
            "unit": summary["price_unit"]}


def cost_lines(summary: Mapping[str, Any], spans: Sequence[AttemptSpan], price: OwnPrice | str,
               now: float, attempt_kwh: Sequence[float | None] | None = None) -> dict[str, Any]:
    """A run summary's ``cost``: ``{"yours": ..., "cloud_reference": ...}``.

    Args:
        summary: The run's summary (db/run_summary.py), its ``energy`` read when there is one.
        spans: Its attempts, oldest first.
        price: The owner's price, or why the settings file cannot be read (then ``yours`` has no
            number and says so in ``reason``).
        now: The time a running attempt is counted up to.
        attempt_kwh: Each attempt's own energy, oldest first, where it is known; else the run's
            total is shared among its attempts by their time.
    """
    energy = summary.get("energy") or {}
    kwh = list(attempt_kwh) if attempt_kwh is not None else spread_energy(energy.get("kwh"), spans, now)
    devices = devices_held(summary["price_unit"] or "", summary["nproc"])
    eta = summary["eta_s"]  # None once the run ended (0 when it succeeded): nothing left to project
    if isinstance(price, str):
        yours = your_cost(spans, kwh, devices, OwnPrice(), eta, now) | {"reason": price}
    else:
        yours = your_cost(spans, kwh, devices, price, eta, now)
    yours["energy_method"] = energy.get("method") or "not measured"
    return {"yours": yours, "cloud_reference": cloud_reference(summary)}
