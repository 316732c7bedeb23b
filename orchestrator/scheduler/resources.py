"""What the machine has to run on: GPUs counted through NVML when present, CPU slots otherwise.

Only the scheduler detects (NVML is slow to start and needs the driver); it publishes what it found
on its heartbeat (db/vocabulary/scheduler_file.py), where the UI reads it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

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
