"""What the machine has to run on: GPUs counted through NVML when present, CPU slots otherwise."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from orchestrator import OrchestratorError
from trainer.config import RunConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inventory:
    """The devices runs are admitted against."""

    kind: str  # "gpu" or "cpu"
    slots: int
    gpu_names: tuple[str, ...] = field(default_factory=tuple)
    gpu_memory_bytes: tuple[int, ...] = field(default_factory=tuple)  # total memory of each GPU
    memory_bytes: int = 0  # the host's RAM; 0 when unknown

    @property
    def device_label(self) -> str:
        if self.kind == "gpu":
            return self.gpu_names[0] if self.gpu_names else "GPU"
        return "cpu"


def _nvml_gpus() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Each GPU's name and total memory in bytes (empty without NVML or GPUs)."""
    try:
        import pynvml  # nvidia-ml-py, the [gpu] extra
    except ImportError:
        return (), ()
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound on machines without a driver
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


def detect_inventory(environ: dict[str, str] | None = None) -> Inventory:
    """Count the machine's devices.

    ``RUNYARD_CPU_SLOTS`` overrides the CPU slot count (default: the number of cores).

    Raises:
        OrchestratorError: ``RUNYARD_CPU_SLOTS`` is not a whole number.
    """
    import psutil

    env = os.environ if environ is None else environ
    ram = int(psutil.virtual_memory().total)
    gpus, gpu_memory = _nvml_gpus()
    if gpus:
        return Inventory(kind="gpu", slots=len(gpus), gpu_names=gpus, gpu_memory_bytes=gpu_memory, memory_bytes=ram)
    raw = env.get("RUNYARD_CPU_SLOTS") or ""
    try:
        slots = int(raw) if raw else os.cpu_count() or 1
    except ValueError:
        raise OrchestratorError(f"RUNYARD_CPU_SLOTS = {raw!r}: expected a whole number of CPU slots") from None
    return Inventory(kind="cpu", slots=max(1, slots), memory_bytes=ram)


def check_fits(config: RunConfig, inventory: Inventory) -> list[str]:
    """Problems that would keep the run from ever being admitted on this machine."""
    problems = []
    n = config.launch.nproc_per_node
    if n > inventory.slots:
        what = f"{inventory.slots} GPU(s)" if inventory.kind == "gpu" else f"{inventory.slots} CPU slots"
        problems.append(
            f"launch.nproc_per_node = {n}: this machine has only {what}; use at most {inventory.slots}"
        )
    if config.launch.backend == "nccl" and inventory.kind != "gpu":
        problems.append(
            "launch.backend = 'nccl': NCCL needs CUDA GPUs and this machine has none; use 'auto' or 'gloo'"
        )
    return problems
