"""The system monitor (orchestrator/scheduler/sysmon.py) against real psutil, real processes and a
real SQLite database: host and per-rank aggregates of a process tree standing in for torchrun
(tests/unit/orchestrator/scheduler/process_trees.py), retention, windows, rows the database
refuses, the scheduler's job that runs it, and its GPUs. There is no GPU on the machines that run
these tests: NVML is a fake ``pynvml`` module here (the mapping from the scheduler's GPUs to runs
and ranks is what is checked), and the "no NVML" paths are the real ones."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import psutil
import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_sessionmaker
from db.models import SystemMetric
from db.sysmetrics import gpu_devices, run_span, system_series
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.executors.processes import attempt_processes
from orchestrator.scheduler import sysmon
from orchestrator.scheduler.loop import Scheduler
from orchestrator.scheduler.service import add_jobs
from orchestrator.scheduler.sysmon import SAMPLE_S, SystemMonitor
from tests.unit.orchestrator.scheduler.process_trees import (
    START,
    FakeClock,
    Tree,
    by_series,
    no_nvml,
    sample_window,
    start_tree,
    trees,
)

__all__ = ["trees"]  # the fixture, from the helper module

# -- host and processes -----------------------------------------------------------------------


def test_host_and_rank_aggregates_from_a_real_process_tree(
    sessions: sessionmaker[Session], settings: Settings, trees: list[Tree], monkeypatch: pytest.MonkeyPatch
) -> None:
    no_nvml(monkeypatch)
    tree = start_tree(sessions, settings, devices=[])
    trees.append(tree)
    monitor = SystemMonitor(sessions, host="testhost", clock=FakeClock())
    sample_window(monitor)

    with sessions() as s:
        rows = system_series(s)
        assert s.scalar(select(func.count()).select_from(SystemMetric)) == len(rows)
    assert rows, "nothing written"
    assert {r["at"] for r in rows} == {START}  # only the closed window; the open one stays in memory
    assert {r["host"] for r in rows} == {"testhost"}
    for r in rows:
        assert r["min"] <= r["mean"] <= r["max"], r
    series = by_series(rows)
    assert len(series) == len(rows)  # one row per series per window: the write volume

    host = {k[3]: r for k, r in series.items() if k[0] == "host"}
    assert {"cpu_percent", "mem_used_bytes", "mem_total_bytes"} <= host.keys()
    assert host["mem_used_bytes"]["count"] == 5
    assert host["cpu_percent"]["count"] >= 4  # measured between readings: none right after start
    assert host["cpu_percent"]["min"] >= 0 and host["cpu_percent"]["max"] <= 100
    assert 0 < host["mem_used_bytes"]["max"] <= host["mem_total_bytes"]["min"]
    assert host["mem_total_bytes"]["min"] == psutil.virtual_memory().total
    if psutil.net_io_counters() is not None:
        assert host["net_recv_bps"]["count"] == 4  # a rate needs two readings
        assert host["net_sent_bps"]["min"] >= 0

    run = tree.run_id
    spinner_cpu = series[("procs", run, 0, "cpu_percent")]
    assert spinner_cpu["count"] == 4  # a process's first reading is not a measurement
    assert spinner_cpu["mean"] > 5, spinner_cpu  # a busy loop, even on a shared 2-core machine
    holder_rss = series[("procs", run, 1, "rss_bytes")]
    assert holder_rss["count"] == 5
    assert holder_rss["min"] > 64 * 2**20  # the 64 MB it holds
    assert series[("procs", run, 0, "rss_bytes")]["min"] > 0
    tree_rss = series[("procs", run, None, "rss_bytes")]
    assert tree_rss["min"] > holder_rss["min"]  # the tree is the parent plus both ranks
    assert series[("procs", run, None, "cpu_percent")]["max"] >= spinner_cpu["min"]
    assert not [k for k in series if k[0].startswith("gpu")]

    with sessions() as s:  # the query side: the run's rows, the host while it ran
        mine = system_series(s, run_id=run)
        assert {r["device"] for r in mine} == {"procs"}
        assert run_span(s, run) == (START, START + 10)
        host_rows = system_series(s, run_id=run, host_only=True)
        assert {r["device"] for r in host_rows} == {"host"} and len(host_rows) == len(host)
        assert system_series(s, run_id=run, since=START + 10) == []
        assert gpu_devices(s, run) == []


def test_the_process_tree_is_walked_again_when_a_rank_ends_not_on_every_sample(
    sessions: sessionmaker[Session], settings: Settings, trees: list[Tree], monkeypatch: pytest.MonkeyPatch
) -> None:
    no_nvml(monkeypatch)
    walks: list[int] = []
    real = attempt_processes

    def counted(*args: object, **kwargs: object) -> list[psutil.Process]:
        walks.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sysmon, "attempt_processes", counted)
    tree = start_tree(sessions, settings, devices=[])
    trees.append(tree)
    monitor = SystemMonitor(sessions, host="testhost", clock=FakeClock())
    for _ in range(3):
        monitor.sample()
    assert len(walks) == 1  # the same three processes: walked once (it reads every process's /proc)
    assert ("procs", tree.run_id, 1, "rss_bytes") in monitor._samples
    tree.ranks[1].kill()
    deadline = time.monotonic() + 10
    while sysmon._alive(tree.ranks[1]) and time.monotonic() < deadline:  # dead (a zombie: the parent sleeps)
        time.sleep(0.05)
    before = len(monitor._samples[("procs", tree.run_id, 1, "rss_bytes")])
    monitor.sample()
    assert len(walks) == 2  # a process ended: walked again at once
    assert len(monitor._samples[("procs", tree.run_id, 1, "rss_bytes")]) == before  # the dead rank is not counted


def test_rows_of_no_run_are_deleted_after_the_retention_and_a_runs_rows_are_kept(
    sessions: sessionmaker[Session], settings: Settings, trees: list[Tree], monkeypatch: pytest.MonkeyPatch
) -> None:
    no_nvml(monkeypatch)
    tree = start_tree(sessions, settings, devices=[])
    trees.append(tree)
    day = 86_400.0
    old = {"host": "testhost", "device": "host", "rank": None, "key": "cpu_percent", "min": 1.0, "mean": 1.0,
           "max": 1.0, "count": 1}
    with sessions() as s:
        s.execute(insert(SystemMetric), [
            {**old, "at": START - 31 * day, "run_id": None},  # past the 30 days: goes
            {**old, "at": START - 29 * day, "run_id": None},  # within them: stays
            {**old, "at": START - 31 * day, "run_id": tree.run_id, "device": "procs"},  # a run's: stays
        ])
        s.commit()
    monitor = SystemMonitor(sessions, host="testhost", clock=FakeClock(), retention_s=30 * day)
    sample_window(monitor, real_gap_s=0.05)
    with sessions() as s:
        kept = s.execute(select(SystemMetric.at, SystemMetric.run_id).where(SystemMetric.at < START)).all()
    assert sorted(kept) == sorted([(START - 29 * day, None), (START - 31 * day, tree.run_id)])


def test_nothing_is_recorded_while_no_attempt_runs(sessions: sessionmaker[Session],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    no_nvml(monkeypatch)
    monitor = SystemMonitor(sessions, host="testhost", clock=FakeClock())
    sample_window(monitor, real_gap_s=0.0)
    monitor.close()
    with sessions() as s:
        assert system_series(s) == []


def test_close_writes_the_open_window_and_later_windows_follow(
    sessions: sessionmaker[Session], settings: Settings, trees: list[Tree], monkeypatch: pytest.MonkeyPatch
) -> None:
    no_nvml(monkeypatch)
    trees.append(start_tree(sessions, settings, devices=[]))
    monitor = SystemMonitor(sessions, host="testhost", clock=FakeClock())
    sample_window(monitor, samples=5, real_gap_s=0.05)  # writes window START
    monitor.sample()  # START + 12: second sample of window START + 10
    monitor.close()
    with sessions() as s:
        mem = [r for r in system_series(s, host_only=True) if r["key"] == "mem_used_bytes"]
        merged = system_series(s, host_only=True, bucket_s=20)
    assert [(r["at"], r["count"]) for r in mem] == [(START, 5), (START + 10, 2)]
    merged_mem = [r for r in merged if r["key"] == "mem_used_bytes"]
    assert [(r["at"], r["count"]) for r in merged_mem] == [(START, 7)]  # START is a multiple of 20
    assert merged_mem[0]["min"] == min(r["min"] for r in mem)
    assert merged_mem[0]["max"] == max(r["max"] for r in mem)
    assert merged_mem[0]["mean"] == pytest.approx((mem[0]["mean"] * 5 + mem[1]["mean"] * 2) / 7)


def test_rows_the_database_refuses_are_kept_for_the_next_write(
    sessions: sessionmaker[Session], settings: Settings, trees: list[Tree], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    no_nvml(monkeypatch)
    trees.append(start_tree(sessions, settings, devices=[]))
    monitor = SystemMonitor(sessions, host="testhost", clock=FakeClock())
    for _ in range(3):
        monitor.sample()
    monitor.sessions = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'no-tables.db'}"))
    monitor.flush()  # "no such table": logged, kept
    monitor.sessions = sessions
    monitor.flush()
    with sessions() as s:
        rows = system_series(s)
    assert rows and {r["count"] for r in rows if r["key"] == "mem_used_bytes"} == {3}


def test_a_failing_sample_is_logged_not_raised(
    sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    no_nvml(monkeypatch)
    monitor = SystemMonitor(sessions, host="testhost")
    monkeypatch.setattr(monitor, "_running_attempts", lambda: 1 / 0)
    monitor.job()
    monitor.job()  # logged once a minute at most
    assert [r.message for r in caplog.records if "system sample failed" in r.message] == [
        "system sample failed; trying again in 2 s"]


# -- the scheduler runs it ------------------------------------------------------------------------


def test_scheduler_runs_the_sysmon_job_beside_the_tick(
    sessions: sessionmaker[Session], settings: Settings, trees: list[Tree], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve`` registers both jobs through ``add_jobs``; here on a background APScheduler, with
    a clock that jumps a whole window per sample so rows appear after two samples (about 4 s)."""
    no_nvml(monkeypatch)
    tree = start_tree(sessions, settings, devices=[])
    trees.append(tree)
    monitor = SystemMonitor(sessions, host="testhost", clock=FakeClock(step=10.0))
    scheduler = Scheduler(sessions, settings, Inventory(kind="cpu", slots=2))
    aps = BackgroundScheduler()
    add_jobs(aps, scheduler, monitor)
    job = aps.get_job("sysmon")
    assert job is not None and job.func == monitor.job
    assert job.trigger.interval.total_seconds() == SAMPLE_S
    assert job.max_instances == 1 and job.coalesce is True
    assert aps.get_job("tick") is not None
    aps.start()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with sessions() as s:
                if system_series(s, run_id=tree.run_id):
                    break
            time.sleep(0.2)
        else:
            raise AssertionError("the sysmon job wrote nothing in 15 s")
    finally:
        aps.shutdown(wait=True)
    with sessions() as s:
        host_cpu = [r for r in system_series(s, host_only=True) if r["key"] == "cpu_percent"]
    # A rank spins, so the host is busy: measured between samples even though APScheduler runs
    # each one on whichever pool thread is free (psutil.cpu_percent() would say 0 on a new one).
    assert host_cpu and all(r["min"] > 0 for r in host_cpu), host_cpu


# -- NVML -----------------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


def fake_pynvml(gpus: int = 4, no_ecc: tuple[int, ...] = (), init_error: Exception | None = None) -> types.ModuleType:
    """A stand-in for nvidia-ml-py (mocked: no GPU on the machines that run these tests).

    GPU ``i`` reports utilization 10*i+5 %, 1 GiB * (i+1) used of 80 GiB, 100+i W of a 700 W
    limit, 40+i C, 1980 MHz SM clock and i ECC errors; ``no_ecc`` GPUs do not support ECC.
    """
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVML_TEMPERATURE_GPU, m.NVML_CLOCK_SM = 0, 1  # type: ignore[attr-defined]
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC = 1, 0  # type: ignore[attr-defined]
    m.calls = []  # type: ignore[attr-defined]

    def init() -> None:
        m.calls.append("init")
        if init_error is not None:
            raise init_error

    def ecc(i: int, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0)
        if i in no_ecc:
            raise NVMLError_NotSupported("Not Supported")
        return i

    m.nvmlInit = init  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: m.calls.append("shutdown")  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: gpus  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = lambda i: types.SimpleNamespace(gpu=10 * i + 5, memory=3)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda i: types.SimpleNamespace(  # type: ignore[attr-defined]
        used=(i + 1) * 2**30, total=80 * 2**30, free=(79 - i) * 2**30)
    m.nvmlDeviceGetPowerUsage = lambda i: (100 + i) * 1000  # type: ignore[attr-defined]  # milliwatts
    m.nvmlDeviceGetEnforcedPowerLimit = lambda i: 700_000  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = lambda i, sensor: 40 + i  # type: ignore[attr-defined]
    m.nvmlDeviceGetClockInfo = lambda i, clock: 1980  # type: ignore[attr-defined]
    m.nvmlDeviceGetTotalEccErrors = ecc  # type: ignore[attr-defined]
    return m


GPU_KEYS = {"util_percent", "mem_used_bytes", "mem_total_bytes", "power_w", "power_limit_w", "temp_c",
            "sm_clock_mhz", "ecc_uncorrected"}


def test_nvml_gpus_are_sampled_and_mapped_to_run_and_rank(
    sessions: sessionmaker[Session], settings: Settings, trees: list[Tree], monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = fake_pynvml(gpus=4, no_ecc=(3,))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    # The scheduler gave this run GPUs 2 and 3; its ranks are 4 and 5 (the second node of a
    # two-node run): LOCAL_RANK indexes the device list, RANK is what is recorded.
    tree = start_tree(sessions, settings, devices=[2, 3], rank_offset=4)
    trees.append(tree)
    monitor = SystemMonitor(sessions, host="testhost", clock=FakeClock())
    sample_window(monitor, real_gap_s=0.05)
    monitor.close()
    assert nvml.calls == ["init", "shutdown"]

    with sessions() as s:
        rows = system_series(s, until=START)  # the full window (close() wrote the next one too)
        devices = gpu_devices(s, tree.run_id)
    gpu: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["device"].startswith("gpu"):
            gpu.setdefault(r["device"], {})[r["key"]] = r
    assert sorted(gpu) == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert set(gpu["gpu2"]) == GPU_KEYS
    assert set(gpu["gpu3"]) == GPU_KEYS - {"ecc_uncorrected"}  # unsupported: the key is skipped
    owners = {d: {(r["run_id"], r["rank"]) for r in keys.values()} for d, keys in gpu.items()}
    assert owners == {"gpu0": {(None, None)}, "gpu1": {(None, None)},
                      "gpu2": {(tree.run_id, 4)}, "gpu3": {(tree.run_id, 5)}}
    g2 = gpu["gpu2"]
    assert g2["util_percent"]["mean"] == 25 and g2["util_percent"]["count"] == 5
    assert g2["mem_used_bytes"]["mean"] == 3 * 2**30 and g2["mem_total_bytes"]["mean"] == 80 * 2**30
    assert g2["power_w"]["mean"] == 102.0 and g2["power_limit_w"]["mean"] == 700.0  # watts, not milliwatts
    assert g2["temp_c"]["mean"] == 42 and g2["sm_clock_mhz"]["mean"] == 1980 and g2["ecc_uncorrected"]["max"] == 2
    assert devices == [{"host": "testhost", "device": "gpu2", "rank": 4},
                       {"host": "testhost", "device": "gpu3", "rank": 5}]


@pytest.mark.parametrize("nvml", ["not installed", "no driver"])
def test_without_nvml_no_gpu_rows_and_no_error(
    nvml: str, sessions: sessionmaker[Session], settings: Settings, trees: list[Tree], monkeypatch: pytest.MonkeyPatch
) -> None:
    if nvml == "not installed":
        no_nvml(monkeypatch)
    else:  # installed, but no NVIDIA driver (what nvmlInit does on a machine without a GPU)
        no_driver = NVMLError_LibraryNotFound("libnvidia-ml.so.1")
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=no_driver))
    tree = start_tree(sessions, settings, devices=[0, 1])  # even a run that was given GPUs
    trees.append(tree)
    monitor = SystemMonitor(sessions, host="testhost", clock=FakeClock())
    sample_window(monitor, real_gap_s=0.05)
    monitor.close()
    with sessions() as s:
        rows = system_series(s)
        assert gpu_devices(s, tree.run_id) == []
    assert {r["device"] for r in rows} == {"host", "procs"}
