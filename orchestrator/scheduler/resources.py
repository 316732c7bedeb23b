"""What the machine has to run on: GPUs counted through NVML when present, CPU slots otherwise;
and how its GPUs are doing, read through NVML for the system monitor (:class:`GpuSampler`,
orchestrator/scheduler/sysmon.py).

Only the scheduler detects (NVML is slow to start and needs the driver); it publishes what it found
on its heartbeat (db/vocabulary/scheduler_file.py), where the UI reads it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

from db.vocabulary.inventory import Inventory
from db.vocabulary.scheduler_file import read_scheduler_file
from db.vocabulary.settings import EnvSettings

logger = logging.getLogger(__name__)


def _nvml_gpus() -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """Each GPU's name, total memory in bytes and UUID (empty without NVML or GPUs)."""
    try:
        import pynvml  # noqa: PLC0415 - optional: nvidia-ml-py, the [gpu] extra
    except ImportError:
        return (), (), ()
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound on machines without a driver
        logger.debug("NVML unavailable: %s", exc)
        return (), (), ()
    try:
        names, memory, uuids = [], [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            names.append(name.decode() if isinstance(name, bytes) else str(name))
            memory.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuids.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
        return tuple(names), tuple(memory), tuple(uuids)
    finally:
        pynvml.nvmlShutdown()


def known_inventory(scheduler_file: Path) -> Inventory:
    """What the scheduler detected and published (db/vocabulary/scheduler_file.py), else this machine's
    devices detected here (NVML included). What ``runyard submit`` and ``fork`` check a run
    against: starting NVML (and importing it) is most of a submit's own time otherwise."""
    published = (read_scheduler_file(scheduler_file) or {}).get("inventory")
    if isinstance(published, dict):
        try:
            return Inventory.from_json(published)
        except (KeyError, TypeError, ValueError):
            pass  # an older scheduler's record
    return detect_inventory()


def detect_inventory(environ: Mapping[str, str] | None = None, nvml: bool = True) -> Inventory:
    """Count the machine's devices.

    ``RUNYARD_CPU_SLOTS`` overrides the CPU slot count (default: the number of cores). With
    ``nvml=False`` GPUs are not looked for (the UI's fallback when no scheduler published one).

    Raises:
        SettingsError: ``RUNYARD_CPU_SLOTS`` (or another ``RUNYARD_*`` variable) is not usable.
    """
    env = os.environ if environ is None else environ
    ram = int(psutil.virtual_memory().total)
    gpus, gpu_memory, uuids = _nvml_gpus() if nvml else ((), (), ())
    if gpus:
        return Inventory(kind="gpu", slots=len(gpus), gpu_names=gpus, gpu_memory_bytes=gpu_memory, memory_bytes=ram,
                         gpu_uuids=uuids)
    slots = EnvSettings.from_env(env).cpu_slots or os.cpu_count() or 1
    return Inventory(kind="cpu", slots=slots, memory_bytes=ram)


class GpuSampler:
    """Every GPU's readings (utilization, memory, power and its limit, temperature, SM clock,
    uncorrected ECC errors). NVML is started on the first read and kept until :meth:`close`;
    without nvidia-ml-py or a driver nothing is read (said once). A reading the GPU does not
    support is skipped alone.

    Args:
        nvml: the ``pynvml`` module; default: imported when installed.
    """

    def __init__(self, nvml: ModuleType | None = None):
        self._nvml = nvml
        self._tried = False
        self._handles: list[Any] = []

    def read(self) -> dict[int, dict[str, float]]:
        """GPU index -> reading -> value (empty without NVML)."""
        nvml = self._ready()
        if nvml is None:
            return {}
        error = getattr(nvml, "NVMLError", Exception)
        found: dict[int, dict[str, float]] = {}
        for index, handle in enumerate(self._handles):
            readings = found.setdefault(index, {})
            for read in _GPU_READERS:
                try:
                    readings.update(read(nvml, handle))
                except error as exc:  # NVMLError_NotSupported (ECC on consumer GPUs), and the like
                    logger.debug("gpu%d: %s: %s", index, read.__name__, exc)
        return found

    def close(self) -> None:
        """Let go of NVML."""
        if self._handles and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:  # noqa: BLE001 - shutting down: nothing to do about it
                logger.debug("nvmlShutdown: %s", exc)
        self._handles = []

    def _ready(self) -> ModuleType | None:
        """NVML, initialised once; None without nvidia-ml-py or without a driver."""
        if self._tried:
            return self._nvml if self._handles else None
        self._tried = True
        if self._nvml is None:
            try:
                import pynvml  # noqa: PLC0415 - optional: nvidia-ml-py, the [gpu] extra
            except ImportError:
                logger.info("system monitor: nvidia-ml-py not installed; no GPU metrics")
                return None
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound on machines without a driver
            logger.info("system monitor: NVML unavailable (%s); no GPU metrics", exc)
            return None
        try:
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as exc:  # noqa: BLE001 - any NVML error: no GPU metrics
            logger.warning("system monitor: NVML lists no GPUs (%s); no GPU metrics", exc)
            nvml.nvmlShutdown()
            return None
        return nvml if self._handles else None


def _utilization(nvml: Any, handle: Any) -> dict[str, float]:
    return {"util_percent": nvml.nvmlDeviceGetUtilizationRates(handle).gpu}


def _memory(nvml: Any, handle: Any) -> dict[str, float]:
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return {"mem_used_bytes": info.used, "mem_total_bytes": info.total}


def _power(nvml: Any, handle: Any) -> dict[str, float]:
    return {"power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}  # NVML reports milliwatts


def _power_limit(nvml: Any, handle: Any) -> dict[str, float]:
    return {"power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0}


def _temperature(nvml: Any, handle: Any) -> dict[str, float]:
    return {"temp_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)}


def _sm_clock(nvml: Any, handle: Any) -> dict[str, float]:
    return {"sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)}


def _ecc(nvml: Any, handle: Any) -> dict[str, float]:
    return {"ecc_uncorrected": nvml.nvmlDeviceGetTotalEccErrors(
        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)}


# One reader per NVML call, so that an unsupported call skips only its own keys.
_GPU_READERS = (_utilization, _memory, _power, _power_limit, _temperature, _sm_clock, _ecc)
