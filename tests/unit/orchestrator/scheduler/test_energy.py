"""The energy meter (orchestrator/scheduler/energy.py) against a real SQLite database and the
scheduler's real loop. There is no GPU and no readable RAPL on the machines that run these tests:
NVML is a stand-in here (:func:`stand_in_nvml`, a module object exposing the NVML functions the
meter calls, with counters and power readings the test sets), and RAPL is a stand-in folder of
zones in ``tmp_path`` laid out as ``/sys/class/powercap`` is. What is checked is what a person
reads: each run's and attempt's kWh, method and source (db/energy/, the run summary).
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Run, SchedulerHeartbeat
from db.queries import run_detail
from db.requests import create_run
from db.states import AttemptStatus
from db.vocabulary.config import RunConfig, parse_config
from db.vocabulary.cost import Price
from db.vocabulary.energy import JOULES_PER_KWH
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.scheduler.energy import EnergyMeter
from orchestrator.scheduler.loop import Scheduler
from orchestrator.scheduler.sysmon import SystemMonitor
from orchestrator.submission import submit
from tests.unit.orchestrator.fake_runs import fake_command, status, tick_until

GPUS4 = Inventory(kind="gpu", slots=4, gpu_names=("NVIDIA H100 80GB HBM3",) * 4)


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


@dataclass
class Gpus:
    """What the stand-in NVML reads: each GPU's counter in mJ (None: not supported) and power in mW."""

    energy_mj: dict[int, int | None]
    power_mw: dict[int, int] = field(default_factory=dict)
    step_mj: int = 0  # added to every counter at each read (a GPU at work)

    def energy(self, handle: int) -> int:
        value = self.energy_mj[handle]
        if value is None:
            raise NVMLError_NotSupported("Not Supported")
        self.energy_mj[handle] = value + self.step_mj
        return value + self.step_mj


def stand_in_nvml(gpus: Gpus) -> types.ModuleType:
    """A stand-in for the ``pynvml`` module: the functions the meter calls, over ``gpus``."""
    m = types.ModuleType("pynvml")
    m.__dict__.update(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(gpus.energy_mj), nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetTotalEnergyConsumption=gpus.energy, nvmlDeviceGetPowerUsage=lambda h: gpus.power_mw[h],
    )
    return m


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def running_attempt(sessions: sessionmaker[Session], settings: Settings, devices: list[int], nproc: int = 1,
                    started_at: float = 1_000_000.0) -> tuple[int, int]:
    """A run with a RUNNING local attempt on ``devices``: (run id, attempt id)."""
    config = RunConfig.model_validate({"name": "energy", "launch": {"nproc_per_node": nproc}})
    with sessions() as s:
        run = create_run(s, config, settings.runs_dir, Price(usd_per_hour=1.0, unit="gpu-hour"))
        s.flush()
        attempt = Attempt(run_id=run.id, number=1, status=AttemptStatus.RUNNING.value, dir=f"{run.run_dir}/attempts/1",
                          devices_json=json.dumps(devices), started_at=started_at)
        s.add(attempt)
        s.commit()
        return run.id, attempt.id


def read(sessions: sessionmaker[Session], meter: EnergyMeter, attempt_id: int, end: bool = False) -> None:
    """The loop's reading at an attempt's start (or end)."""
    with sessions() as s:
        attempt = s.get_one(Attempt, attempt_id)
        run = s.get_one(Run, attempt.run_id)
        if end:
            meter.end(s, run, attempt)
            s.commit()
        else:
            meter.start(s, run, attempt)


def energy(sessions: sessionmaker[Session], run_id: int) -> tuple[dict, dict]:
    """The run's energy in its summary, and its first attempt's in the run detail."""
    with sessions() as s:
        detail = run_detail(s, run_id)
    return detail["energy"], detail["attempts"][0]["energy"]


def test_a_run_on_two_gpus_counts_those_two_through_a_driver_reload(
        sessions: sessionmaker[Session], settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the monitor's own GPU sampler: no NVML
    gpus = Gpus({0: 1_000_000, 1: 5_000_000, 2: 0, 3: 0})
    clock = Clock()
    meter = EnergyMeter(sessions, GPUS4, nvml=stand_in_nvml(gpus), clock=clock)
    run_id, attempt_id = running_attempt(sessions, settings, devices=[0, 1], nproc=2)
    read(sessions, meter, attempt_id)
    for i in range(4):
        gpus.energy_mj[i] = (gpus.energy_mj[i] or 0) + 500_000  # 500 J each, GPUs 2 and 3 another run's
    clock.now += 2
    SystemMonitor(sessions, energy=meter).job()  # the system-metrics tick
    gpus.energy_mj = {0: 200_000, 1: 200_000, 2: 9_000_000, 3: 9_000_000}  # the driver reloaded: from 0
    clock.now += 2
    SystemMonitor(sessions, energy=meter).job()
    gpus.energy_mj = {i: (v or 0) + 100_000 for i, v in gpus.energy_mj.items()}
    read(sessions, meter, attempt_id, end=True)

    run, attempt = energy(sessions, run_id)
    assert run == attempt
    assert run["kwh"] == pytest.approx(2 * (500 + 200 + 100) / JOULES_PER_KWH)
    assert run["method"] == "measured"
    assert run["source"] == "NVML energy counter, GPUs 0 and 1"


def test_without_a_counter_power_times_time_is_estimated(sessions: sessionmaker[Session],
                                                         settings: Settings) -> None:
    gpus = Gpus({0: None}, power_mw={0: 300_000})
    clock = Clock()
    meter = EnergyMeter(sessions, GPUS4, nvml=stand_in_nvml(gpus), clock=clock)
    run_id, attempt_id = running_attempt(sessions, settings, devices=[0])
    read(sessions, meter, attempt_id)
    clock.now += 2
    meter.job()  # 300 W for 2 s
    gpus.power_mw[0], clock.now = 100_000, clock.now + 1
    read(sessions, meter, attempt_id, end=True)  # 300 W to 100 W over 1 s

    run, _ = energy(sessions, run_id)
    assert run == {"kwh": pytest.approx((600 + 200) / JOULES_PER_KWH), "method": "estimated",
                   "source": "NVML power x time, GPU 0"}


def test_a_scheduler_restart_goes_on_from_the_stored_reading(sessions: sessionmaker[Session],
                                                             settings: Settings) -> None:
    """GPU 0 has a counter, which covers the minute no scheduler read it; GPU 1 only power, which
    cannot: that minute is not counted, and the source says so."""
    gpus = Gpus({0: 0, 1: None}, power_mw={1: 200_000})
    clock = Clock()
    first = EnergyMeter(sessions, GPUS4, nvml=stand_in_nvml(gpus), clock=clock)
    run_id, attempt_id = running_attempt(sessions, settings, devices=[0, 1], nproc=2)
    read(sessions, first, attempt_id)
    gpus.energy_mj[0], clock.now = 400_000, clock.now + 2
    first.job()  # 400 J and 200 W x 2 s
    gpus.energy_mj[0], clock.now = 12_400_000, clock.now + 60  # the scheduler is down for a minute
    second = EnergyMeter(sessions, GPUS4, nvml=stand_in_nvml(gpus), clock=clock)  # another takes over
    second.job()
    clock.now += 2
    read(sessions, second, attempt_id, end=True)  # 200 W x 2 s more

    run, _ = energy(sessions, run_id)
    assert run["kwh"] == pytest.approx((12_400 + 400 + 400) / JOULES_PER_KWH)
    assert run["method"] == "estimated"  # the weaker of the two GPUs'
    assert run["source"] == ("NVML energy counter, GPU 0; NVML power x time, GPU 1 "
                             "(60 s not covered: no reading spanned them)")


def rapl_zone(root: Path, name: str, energy_uj: int, range_uj: int) -> Path:
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{range_uj}\n")
    return zone


def test_rapl_package_energy_wraps_and_is_shared_by_the_slots_held(sessions: sessionmaker[Session],
                                                                    settings: Settings, tmp_path: Path) -> None:
    powercap = tmp_path / "powercap"
    rapl_zone(powercap, "intel-rapl:0", 900_000_000, 1_000_000_000)
    rapl_zone(powercap, "intel-rapl:0:0", 5, 1_000_000_000)  # a part of package 0 (its cores): not added again
    cpu = Inventory(kind="cpu", slots=4)
    meter = EnergyMeter(sessions, cpu, powercap=powercap, clock=Clock())
    run_id, attempt_id = running_attempt(sessions, settings, devices=[], nproc=2)
    read(sessions, meter, attempt_id)
    rapl_zone(powercap, "intel-rapl:0", 100_000_000, 1_000_000_000)  # wrapped past 1000 J: 200 J on
    rapl_zone(powercap, "intel-rapl:0:0", 999_000_000, 1_000_000_000)
    read(sessions, meter, attempt_id, end=True)

    run, _ = energy(sessions, run_id)
    assert run == {"kwh": pytest.approx(100 / JOULES_PER_KWH), "method": "measured",
                   "source": "RAPL package energy, 2 of 4 CPU slots"}


def test_without_gpu_or_readable_rapl_energy_is_not_measured_and_says_why(
        sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    meter = EnergyMeter(sessions, Inventory(kind="cpu", slots=2), powercap=tmp_path / "none", clock=Clock())
    run_id, attempt_id = running_attempt(sessions, settings, devices=[])
    read(sessions, meter, attempt_id)
    read(sessions, meter, attempt_id, end=True)

    run, attempt = energy(sessions, run_id)
    assert run == attempt
    assert run["kwh"] is None and run["method"] == "not measured"
    assert run["source"].startswith("no GPU energy counter and no readable RAPL: no RAPL package under ")


def test_an_attempt_shorter_than_a_tick_is_read_at_its_start_and_end(sessions: sessionmaker[Session],
                                                                     settings: Settings) -> None:
    """Through the scheduler's own loop, with no monitor running: a run of a moment on GPU 0 of two."""
    gpus = Gpus({0: 0, 1: 0}, step_mj=50_000)  # 50 J between two reads of a GPU
    two = Inventory(kind="gpu", slots=2, gpu_names=("NVIDIA H100 80GB HBM3",) * 2)
    scheduler = Scheduler(sessions, settings, two, command=fake_command)
    scheduler.energy = EnergyMeter(sessions, two, nvml=stand_in_nvml(gpus))
    run_id = submit(sessions, settings, parse_config({"name": "quick", "launch": {"nproc_per_node": 1}}), two)
    tick_until(scheduler, lambda: status(sessions, run_id) in ("SUCCEEDED", "FAILED"))

    run, attempt = energy(sessions, run_id)
    assert status(sessions, run_id) == "SUCCEEDED"
    assert run == attempt == {"kwh": pytest.approx(50 / JOULES_PER_KWH), "method": "measured",
                              "source": "NVML energy counter, GPU 0"}


def test_a_run_that_has_not_started_has_no_energy(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = submit(sessions, settings, parse_config({"name": "queued"}), Inventory(kind="cpu", slots=2))
    with sessions() as s:
        assert run_detail(s, run_id)["energy"] == {"kwh": None, "method": "not measured", "source": "not started"}


def test_only_this_hosts_local_attempts_are_read_and_a_slurm_one_says_why_not(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    """Two schedulers may share a PostgreSQL database: another host's GPU 0 is not this one's."""
    gpus = Gpus({0: 0}, step_mj=50_000)
    meter = EnergyMeter(sessions, GPUS4, host="this-node", nvml=stand_in_nvml(gpus), clock=Clock())
    elsewhere, elsewhere_attempt = running_attempt(sessions, settings, devices=[0])
    slurm, slurm_attempt = running_attempt(sessions, settings, devices=[])
    with sessions() as s:
        other = SchedulerHeartbeat(host="other-node", pid=1, started_at=0.0, beat_at=0.0, home="/elsewhere")
        s.add(other)
        s.flush()
        s.get_one(Attempt, elsewhere_attempt).scheduler_id = other.id
        s.get_one(Attempt, slurm_attempt).executor = "slurm"
        s.commit()
    read(sessions, meter, slurm_attempt)
    meter.job()
    read(sessions, meter, slurm_attempt, end=True)

    assert energy(sessions, elsewhere)[0]["source"] == "not read (the attempt ran before runyard read energy)"
    assert energy(sessions, slurm)[0] == {"kwh": None, "method": "not measured",
                                          "source": "runs under slurm: its nodes are not read here"}


def test_an_attempt_settled_long_after_its_last_reading_is_not_charged_for_the_time_between(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    """No scheduler ran for an hour: the attempt may have ended at its start, and the GPU since did
    other work. Its end is not read; the hour is said to be not covered."""
    gpus = Gpus({0: 0})
    clock = Clock()
    meter = EnergyMeter(sessions, GPUS4, nvml=stand_in_nvml(gpus), clock=clock)
    run_id, attempt_id = running_attempt(sessions, settings, devices=[0])
    read(sessions, meter, attempt_id)
    gpus.energy_mj[0], clock.now = 600_000, clock.now + 2
    meter.job()  # 600 J
    gpus.energy_mj[0], clock.now = 900_000_000, clock.now + 3600  # an hour of another program's work
    read(sessions, meter, attempt_id, end=True)

    run, _ = energy(sessions, run_id)
    assert run["kwh"] == pytest.approx(600 / JOULES_PER_KWH)
    assert run["source"] == "NVML energy counter, GPU 0 (3600 s not covered: no reading spanned them)"
