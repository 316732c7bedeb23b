"""The two cost lines in words, shared by the CLI and the UI: "Your cost" (energy at your tariff and
your hardware's amortisation) and "Cloud reference" (the list price the run was submitted at), never
mixed (docs/COSTS.md, "Your cost and the cloud reference")."""

from __future__ import annotations

from typing import Any

from db.vocabulary.your_cost import OwnPrice
from orchestrator.format import usd

YOURS = "Your cost"
CLOUD = "Cloud reference"


def own_price_text(price: OwnPrice) -> str:
    """What the owner's settings make of a GPU-hour: the hardware's amortisation and the tariff."""
    if price.hardware_usd_per_gpu is None:
        hardware = "no hardware price set (no hardware part)"
    else:
        hardware = (f"hardware {usd(price.hardware_usd_per_gpu_hour)} per GPU-hour "
                    f"({usd(price.hardware_usd_per_gpu)} over {price.hardware_life_years:g} years x "
                    f"{price.busy_hours_per_year:g} busy hours)")
    if price.electricity_usd_per_kwh is None:
        energy = "no electricity tariff set, so no cost of yours is shown"
    else:
        energy = f"energy at {tariff_text(price.electricity_usd_per_kwh, price.pue)}"
    return f"Your cost per GPU-hour: {hardware}; {energy}"


def tariff_text(usd_per_kwh: float, pue: float) -> str:
    """A tariff and PUE as a person writes them: "$0.30/kWh x PUE 1.0", "$0.075/kWh x PUE 1.25"."""
    cents = round(usd_per_kwh * 100, 6)
    price = f"{usd_per_kwh:.2f}" if cents == int(cents) else f"{usd_per_kwh:.4g}"
    return f"${price}/kWh x PUE {pue:.1f}" if round(pue, 1) == pue else f"${price}/kWh x PUE {pue:g}"


def energy_text(energy: dict[str, Any] | None) -> str:
    """A run's energy: "1.234 kWh (measured: NVML energy counter, GPUs 0 and 1)", or "not measured"."""
    if not energy or energy.get("kwh") is None:
        why = (energy or {}).get("source")
        return "not measured" + (f" ({why})" if why else "")
    source = f": {energy['source']}" if energy.get("source") else ""
    return f"{energy['kwh']:.4g} kWh ({energy.get('method', 'measured')}{source})"


def energy_short(energy: dict[str, Any] | None, missing: str = "–") -> str:
    """A run's energy in a table cell: "0.123 kWh" measured, "≈0.123 kWh" estimated, ``missing``
    when not measured."""
    if not energy or energy.get("kwh") is None:
        return missing
    return ("≈" if energy.get("method") == "estimated" else "") + f"{energy['kwh']:.3g} kWh"


def yours_text(yours: dict[str, Any], running: bool) -> str:
    """The "Your cost" line: its total with its parts, the wasted part and, while the run goes on,
    the projected total; or why there is no number."""
    if yours["usd"] is None:
        return str(yours["reason"])
    energy = (f"energy {usd(yours['energy_usd'])} ({yours['energy_kwh']:.4g} kWh x "
              f"{tariff_text(yours['usd_per_kwh'], yours['pue'])})" if yours["energy_usd"] is not None
              else "energy not measured")
    text = (f"{usd(yours['usd'])} = {energy} + hardware {usd(yours['hardware_usd'])}, "
            f"wasted {usd(yours['wasted_usd'])}")
    return text + (f", projected {usd(yours['projected_usd'])}" if running else "")


def cloud_text(cloud: dict[str, Any], running: bool) -> str:
    """The "Cloud reference" line: device time at the list price the run was submitted at."""
    text = f"{usd(cloud['usd'])} ({cloud['unit']}), wasted {usd(cloud['wasted_usd'])}"
    return text + (f", projected {usd(cloud['projected_usd'])}" if running else "")


def cost_lines_text(summary: dict[str, Any]) -> list[str]:
    """A run's energy and its two cost lines, as `runyard show` prints them."""
    cost = summary["cost"]
    running = summary["eta_s"] is not None and summary["status"] != "SUCCEEDED"
    return [f"energy {energy_text(summary.get('energy'))}",
            f"{YOURS.lower()}: {yours_text(cost['yours'], running)}",
            f"{CLOUD.lower()}: {cloud_text(cost['cloud_reference'], running)}"]
