"""Your cost (db/vocabulary/your_cost.py): measured energy at the owner's tariff and PUE plus the
hardware's amortisation, its wasted part in both lines, and no number without a tariff."""

from __future__ import annotations

from pathlib import Path

import pytest

from db.vocabulary.cost import AttemptSpan
from db.vocabulary.settings_file import settings_path, write_values
from db.vocabulary.your_cost import (
    ENERGY_NOT_MEASURED,
    NO_TARIFF,
    OwnPrice,
    cost_lines,
    devices_held,
    own_price,
    your_cost,
)

HOUR = 3600.0
PRICE = OwnPrice(electricity_usd_per_kwh=0.30, pue=1.5, hardware_usd_per_gpu=8760.0, hardware_life_years=1.0,
                 busy_hours_per_year=4380.0)  # hardware: $2 per GPU-hour


def span(start: float, end: float | None, *, failed: bool = False, checkpoint: float | None = None,
         after_failure: bool = False, first_step: float | None = None) -> AttemptSpan:
    return AttemptSpan(started_at=start, ended_at=end, first_step_at=first_step, failed=failed,
                       last_checkpoint_at=checkpoint, after_failure=after_failure)


def test_hardware_per_gpu_hour_is_price_over_life_and_busy_hours() -> None:
    assert PRICE.hardware_usd_per_gpu_hour == pytest.approx(2.0)
    assert OwnPrice().hardware_usd_per_gpu_hour == 0.0  # no hardware price: no hardware part


def test_energy_times_tariff_and_pue_plus_amortisation() -> None:
    """Two GPUs for one hour, 1 kWh measured: 1 x 0.30 x 1.5 + 2 GPU-h x $2."""
    line = your_cost([span(0.0, HOUR)], [1.0], 2.0, PRICE, None, now=HOUR)
    assert line["energy_usd"] == pytest.approx(0.45)
    assert line["hardware_usd"] == pytest.approx(4.0)
    assert line["usd"] == pytest.approx(4.45)
    assert line["wasted_usd"] == 0.0 and line["reason"] is None and line["note"] is None


def test_no_tariff_gives_no_number_and_says_why() -> None:
    line = your_cost([span(0.0, HOUR)], [1.0], 1.0, OwnPrice(hardware_usd_per_gpu=1000.0), None, now=HOUR)
    assert line["usd"] is None and line["wasted_usd"] is None and line["projected_usd"] is None
    assert line["reason"] == NO_TARIFF and "Settings" in NO_TARIFF


def test_energy_not_measured_is_the_hardware_part_only_and_says_so() -> None:
    line = your_cost([span(0.0, HOUR)], [None], 1.0, PRICE, None, now=HOUR)
    assert line["usd"] == pytest.approx(2.0) and line["energy_usd"] is None
    assert line["note"] == ENERGY_NOT_MEASURED


def test_wasted_splits_each_attempts_energy_over_its_time() -> None:
    """Attempt 1 fails 3/4 of the way through its hour after a checkpoint at 1/4: half its hour
    is lost work, so half its hardware and half its energy are wasted. Attempt 2 restarts
    and spends 0.1 h before its first step: wasted too."""
    spans = [span(0.0, HOUR, failed=True, checkpoint=0.25 * HOUR),
             span(HOUR, 2 * HOUR, after_failure=True, first_step=1.1 * HOUR)]
    line = your_cost(spans, [2.0, 1.0], 1.0, PRICE, None, now=2 * HOUR)
    hardware = 0.75 * 2.0 + 0.1 * 2.0
    energy = (2.0 * 0.75 + 1.0 * 0.1) * 0.30 * 1.5
    assert line["wasted_usd"] == pytest.approx(hardware + energy)
    assert line["usd"] == pytest.approx(2 * 2.0 + 3.0 * 0.45)


def test_projected_adds_the_eta_at_the_runs_own_pace_of_spending() -> None:
    """Half an hour to go at 1 kW and $2/GPU-h: 0.5 x (2 + 1 x 0.45) more."""
    line = your_cost([span(0.0, None)], [1.0], 1.0, PRICE, 0.5 * HOUR, now=HOUR)
    assert line["projected_usd"] == pytest.approx(line["usd"] + 0.5 * (2.0 + 0.45))


@pytest.mark.parametrize(("unit", "nproc", "devices"), [
    ("2 x NVIDIA H100 80GB HBM3 @ $2.99/h", 2, 2.0),
    ("2/16 of a CPU node @ $0.1/h", 2, 0.125),  # the machine's hardware, shared by its slots
    ("8 Slurm GPU(s) (2 x 4) @ $2.0/h", 8, 8.0),
    ("2 Slurm node(s) @ $1.0/h", 16, 2.0),
    ("", 3, 3.0),
])
def test_devices_held_reads_the_snapshotted_unit(unit: str, nproc: int, devices: float) -> None:
    assert devices_held(unit, nproc) == pytest.approx(devices)


def test_cost_lines_keep_the_cloud_reference_apart(tmp_path: Path) -> None:
    summary = {"status": "SUCCEEDED", "eta_s": 0.0, "nproc": 1, "price_unit": "1 x H100 @ $2.99/h",
               "price_usd_per_hour": 2.99, "cost_usd": 2.99, "cost_wasted_usd": 0.0, "cost_projected_usd": 2.99,
               "energy": {"kwh": 0.7, "method": "measured", "source": "NVML energy counter, GPU 0"}}
    lines = cost_lines(summary, [span(0.0, HOUR)], PRICE, now=HOUR)
    assert lines["cloud_reference"] == {"usd": 2.99, "wasted_usd": 0.0, "projected_usd": 2.99,
                                        "usd_per_hour": 2.99, "unit": "1 x H100 @ $2.99/h"}
    assert lines["yours"]["usd"] == pytest.approx(0.7 * 0.45 + 2.0)
    assert lines["yours"]["energy_method"] == "measured"
    # No energy dict yet (a summary from before the energy meter): not measured, hardware only.
    del summary["energy"]
    assert cost_lines(summary, [span(0.0, HOUR)], PRICE, now=HOUR)["yours"]["energy_method"] == "not measured"


def test_each_attempts_own_energy_prices_its_wasted_part_where_known() -> None:
    """A failed attempt of 3 kWh (all of it lost: no checkpoint) and a good one of 1 kWh: its own
    energy counts, not the run's 4 kWh shared by time (which would waste only 2)."""
    summary = {"status": "SUCCEEDED", "eta_s": 0.0, "nproc": 1, "price_unit": "1 x H100 @ $2.99/h",
               "price_usd_per_hour": 2.99, "cost_usd": 5.98, "cost_wasted_usd": 2.99, "cost_projected_usd": 5.98,
               "energy": {"kwh": 4.0, "method": "measured", "source": "NVML energy counter, GPU 0"}}
    spans = [span(0.0, HOUR, failed=True), span(HOUR, 2 * HOUR, after_failure=True, first_step=HOUR)]
    energy_only = OwnPrice(electricity_usd_per_kwh=1.0)
    own = cost_lines(summary, spans, energy_only, now=2 * HOUR, attempt_kwh=[3.0, 1.0])["yours"]
    shared = cost_lines(summary, spans, energy_only, now=2 * HOUR)["yours"]
    assert own["usd"] == shared["usd"] == pytest.approx(4.0)
    assert own["wasted_usd"] == pytest.approx(3.0) and shared["wasted_usd"] == pytest.approx(2.0)


def test_a_broken_settings_file_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    write_values(tmp_path, {("cost", "electricity_usd_per_kwh"): 0.25})
    assert own_price(tmp_path) == OwnPrice(electricity_usd_per_kwh=0.25)
    settings_path(tmp_path).write_text("[cost]\npue = 0\n")
    reason = own_price(tmp_path)
    assert isinstance(reason, str) and "cost.pue = 0" in reason
