"""What the machine has to run on: GPUs counted through NVML when present, CPU slots otherwise.

Only the scheduler detects (NVML is slow to start and needs the driver); it publishes what it found
on its heartbeat (db/scheduler_file.py), where the UI reads it.
"""

from __future__ import annotations

import logging
import os

from db.inventory import Inventory
from orchestrator import OrchestratorError

logger = logging.getLogger(__name__)


def _nvml_gpus() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Each GPU's name and total memory in bytes (empty without NVML or GPUs)."""
    try:
        import pynvml  # nvidia-ml-py, the [gpu] extra
    except ImportError:
        return (), ()
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound on machines without a driver
        logger.debug("NVML unavailable: %s", exc)
        return (), ()
    try:
        names, memory = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            names.append(name.decode() if isinstance(name, bytes) else str(name))
            memory.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
        return tuple(names), tuple(memory)
    finally:
        pynvml.nvmlShutdown()


def detect_inventory(environ: dict[str, str] | None = None, nvml: bool = True) -> Inventory:
    """Count the machine's devices.

    ``RUNYARD_CPU_SLOTS`` overrides the CPU slot count (default: the number of cores). With
    ``nvml=False`` GPUs are not looked for (the UI's fallback when no scheduler published one).

    Raises:
        OrchestratorError: ``RUNYARD_CPU_SLOTS`` is not a whole number.
    """
    import psutil

    env = os.environ if environ is None else environ
    ram = int(psutil.virtual_memory().total)
    gpus, gpu_memory = _nvml_gpus() if nvml else ((), ())
    if gpus:
        return Inventory(kind="gpu", slots=len(gpus), gpu_names=gpus, gpu_memory_bytes=gpu_memory, memory_bytes=ram)
    raw = env.get("RUNYARD_CPU_SLOTS") or ""
    try:
        slots = int(raw) if raw else os.cpu_count() or 1
    except ValueError:
        raise OrchestratorError(f"RUNYARD_CPU_SLOTS = {raw!r}: expected a whole number of CPU slots") from None
    return Inventory(kind="cpu", slots=max(1, slots), memory_bytes=ram)
