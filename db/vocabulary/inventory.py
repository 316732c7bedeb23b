"""What a machine has to run on, as every process sees it: the scheduler detects it
(orchestrator/scheduler/resources.py, through NVML) and publishes it on its heartbeat; the UI and the CLI
judge submissions against it without touching a GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from db.vocabulary.config import RunConfig


@dataclass(frozen=True)
class Inventory:
    """The devices runs are admitted against."""

    kind: str  # "gpu" or "cpu"
    slots: int
    gpu_names: tuple[str, ...] = field(default_factory=tuple)
    gpu_memory_bytes: tuple[int, ...] = field(default_factory=tuple)  # total memory of each GPU
    memory_bytes: int = 0  # the host's RAM; 0 when unknown
    # Each GPU's NVML UUID (``GPU-...``) by index: what DCGM-exporter labels its series with, so
    # /metrics can say which run holds which GPU (app/server/prometheus.py). Empty when unknown.
    gpu_uuids: tuple[str, ...] = field(default_factory=tuple)

    @property
    def device_label(self) -> str:
        if self.kind == "gpu":
            return self.gpu_names[0] if self.gpu_names else "GPU"
        return "cpu"

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the heartbeat file."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Inventory:
        """The inventory a heartbeat published (``to_json``'s dict)."""
        return cls(
            kind=str(data["kind"]), slots=int(data["slots"]),
            gpu_names=tuple(str(n) for n in data.get("gpu_names", ())),
            gpu_memory_bytes=tuple(int(m) for m in data.get("gpu_memory_bytes", ())),
            memory_bytes=int(data.get("memory_bytes", 0)),
            gpu_uuids=tuple(str(u) for u in data.get("gpu_uuids", ())),
        )


def check_fits(config: RunConfig, inventory: Inventory) -> list[str]:
    """Problems that would keep the run from ever being admitted on this machine."""
    problems: list[str] = []
    launch = config.launch
    if launch.executor == "slurm":
        return problems  # Slurm admits it on its own nodes; this machine's devices say nothing of them
    if launch.world_size > inventory.slots:
        what = f"{inventory.slots} GPU(s)" if inventory.kind == "gpu" else f"{inventory.slots} CPU slots"
        # CPU slots are a setting (the scheduler's RUNYARD_CPU_SLOTS, default the core count), not
        # hardware: the refusal names it, or a person looks for a limit that is not there.
        more = "" if inventory.kind == "gpu" else (
            f", or let {launch.world_size} ranks share the cores: start the scheduler with "
            f"RUNYARD_CPU_SLOTS={launch.world_size} (`RUNYARD_CPU_SLOTS={launch.world_size} runyard up`; "
            "the default is the core count)")
        if launch.nnodes > 1:
            problems.append(
                f"launch.nnodes = {launch.nnodes} x launch.nproc_per_node = {launch.nproc_per_node}: "
                f"{launch.world_size} ranks, and this machine (where every local node runs) has only {what}; "
                f"use at most {inventory.slots} ranks in all, or launch.executor = 'slurm'{more}")
        else:
            problems.append(
                f"launch.nproc_per_node = {launch.nproc_per_node}: this machine has only {what}; "
                f"use at most {inventory.slots}{more}")
    if config.launch.backend == "nccl" and inventory.kind != "gpu":
        problems.append(
            "launch.backend = 'nccl': NCCL needs CUDA GPUs and this machine has none; use 'auto' or 'gloo'"
        )
    return problems
