"""The system monitor's GPUs (orchestrator/scheduler/sysmon.py): sampled through NVML and mapped to
their run and rank, and no GPU rows and no error without NVML. There is no GPU on the machines
that run these tests: NVML is a fake ``pynvml`` module here (the mapping from the scheduler's GPUs
to runs and ranks is what is checked), and the "no NVML" paths are the real ones.
"""

from __future__ import annotations

import sys
import types

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.sysmetrics import gpu_devices, system_series
from db.vocabulary.settings import Settings
from orchestrator.scheduler.sysmon import SystemMonitor
from tests.unit.orchestrator.scheduler.process_trees import (
    START,
    FakeClock,
    Tree,
    no_nvml,
    sample_window,
    start_tree,
    trees,
)

__all__ = ["trees"]  # the fixture, from the helper module

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
        m.calls.append("init")  # type: ignore[attr-defined]
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
    gpu = {}
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
