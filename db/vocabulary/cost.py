"""Cost and ETA.

Prices are USD per device-hour, from public on-demand list prices (rounded); a CPU run is
charged its share of a CPU node. The price is snapshotted on the run at submit time so later
edits do not rewrite history.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from db.vocabulary.inventory import Inventory

DEFAULT_GPU_PRICES_USD_PER_HOUR: dict[str, float] = {
    "H200": 3.79,
    "H100": 2.99,
    "A100": 1.79,
    "L40S": 1.25,
    "A10": 0.75,
    "L4": 0.80,
    "RTX 4090": 0.69,
    "V100": 0.90,
    "T4": 0.35,
}
DEFAULT_GPU_PRICE = 2.00
CPU_NODE = "cpu-node"
OTHER_GPU = "other GPU"
DEFAULT_CPU_NODE_PRICE_USD_PER_HOUR = 0.10
# A Slurm run's price: per GPU-hour of the allocation (a GPU job), per node-hour (a CPU job).
# The cluster's GPU model is not known at submit time; these rows of the price table say what
# an hour of the cluster costs (the Settings page edits them).
SLURM_GPU = "slurm GPU"
SLURM_NODE = "slurm node"
DEFAULT_SLURM_NODE_PRICE_USD_PER_HOUR = 1.00


def default_prices() -> dict[str, float]:
    """The built-in price table: USD per GPU-hour by model, per CPU-node-hour, and a fallback."""
    return {**DEFAULT_GPU_PRICES_USD_PER_HOUR, OTHER_GPU: DEFAULT_GPU_PRICE,
            CPU_NODE: DEFAULT_CPU_NODE_PRICE_USD_PER_HOUR, SLURM_GPU: DEFAULT_GPU_PRICE,
            SLURM_NODE: DEFAULT_SLURM_NODE_PRICE_USD_PER_HOUR}


def gpu_price(name: str, table: Mapping[str, float] | None = None) -> float:
    """Per-GPU-hour price for a GPU model name as NVML reports it (the longest matching model
    name in the table wins: "A100" before "A10")."""
    prices = table or default_prices()
    upper = name.upper()
    models = sorted((m for m in prices if m not in (CPU_NODE, OTHER_GPU, SLURM_GPU, SLURM_NODE)), key=len,
                    reverse=True)
    for model in models:
        if model.upper() in upper:
            return prices[model]
    return prices.get(OTHER_GPU, DEFAULT_GPU_PRICE)


def price_for(nproc: int, inventory: Inventory, table: Mapping[str, float] | None = None) -> Price:
    """The hourly price of a run using ``nproc`` devices of this machine."""
    prices = table or default_prices()
    if inventory.kind == "gpu":
        each = gpu_price(inventory.device_label, prices)
        return Price(usd_per_hour=each * nproc, unit=f"{nproc} x {inventory.device_label} @ ${each}/h")
    node = prices.get(CPU_NODE, DEFAULT_CPU_NODE_PRICE_USD_PER_HOUR)
    return Price(usd_per_hour=node * nproc / inventory.slots,
                 unit=f"{nproc}/{inventory.slots} of a CPU node @ ${node}/h")


def slurm_price(nnodes: int, gpus_per_node: int, table: Mapping[str, float] | None = None) -> Price:
    """The hourly price of a Slurm allocation: its GPUs at the ``slurm GPU`` row of the price
    table, or, for a job without GPUs, its nodes at the ``slurm node`` row."""
    prices = table or default_prices()
    if gpus_per_node > 0:
        each = prices.get(SLURM_GPU, DEFAULT_GPU_PRICE)
        gpus = nnodes * gpus_per_node
        return Price(usd_per_hour=each * gpus, unit=f"{gpus} Slurm GPU(s) ({nnodes} x {gpus_per_node}) @ ${each}/h")
    node = prices.get(SLURM_NODE, DEFAULT_SLURM_NODE_PRICE_USD_PER_HOUR)
    return Price(usd_per_hour=node * nnodes, unit=f"{nnodes} Slurm node(s) @ ${node}/h")


def config_price(launch: Mapping[str, object], slurm: Mapping[str, object], inventory: Inventory,
                 table: Mapping[str, float] | None = None) -> Price:
    """The hourly price of a run config's ``[launch]`` and ``[slurm]`` tables (plain data, as
    stored): this machine's devices for a local run (every node's ranks run here), the Slurm
    allocation for a Slurm run."""
    nnodes = int(launch.get("nnodes") or 1)  # type: ignore[call-overload]
    nproc = int(launch.get("nproc_per_node") or 1)  # type: ignore[call-overload]
    if launch.get("executor") == "slurm":
        return slurm_price(nnodes, int(slurm.get("gpus_per_node") or 0), table)  # type: ignore[call-overload]
    return price_for(nnodes * nproc, inventory, table)


def cost_usd(
    attempts: Sequence[tuple[float, float | None]], usd_per_hour: float, now: float | None = None
) -> float:
    """Sum over attempts (start, end or None while running) of device time x price."""
    now = time.time() if now is None else now
    seconds = sum(max(0.0, (end if end is not None else now) - start) for start, end in attempts)
    return seconds * usd_per_hour / 3600.0


@dataclass(frozen=True)
class AttemptSpan:
    """What the cost arithmetic needs to know about one attempt (times in epoch seconds)."""

    started_at: float
    ended_at: float | None  # None while running
    first_step_at: float | None
    failed: bool  # ended by a failure that was (or could have been) retried
    last_checkpoint_at: float | None  # when its newest checkpoint was written, if any
    after_failure: bool  # this attempt restarts the run after a failed attempt


def wasted_seconds(attempts: Sequence[AttemptSpan], now: float | None = None) -> float:
    """Device time that bought nothing: each failed attempt's time after its last checkpoint
    (all of it when it wrote none), plus each restart's time from launch to its first step."""
    now = time.time() if now is None else now
    wasted = 0.0
    for a in attempts:
        end = a.ended_at if a.ended_at is not None else now
        if a.failed:
            wasted += max(0.0, end - (a.last_checkpoint_at or a.started_at))
        if a.after_failure:
            restart_end = a.first_step_at if a.first_step_at is not None else end
            if not (a.failed and a.last_checkpoint_at is None):  # not counted twice
                wasted += max(0.0, restart_end - a.started_at)
    return wasted


@dataclass(frozen=True)
class Eta:
    """Seconds until the last step: the estimate, and the range the recent pace spans."""

    seconds: float
    low: float
    high: float


# The ETA looks at this many of the newest progress points, in this many equal parts for its range.
ETA_WINDOW = 60
ETA_PARTS = 4


def recent_pace(points: Sequence[tuple[int, float]]) -> float | None:
    """Steps per second over the newest :data:`ETA_WINDOW` of (step, wall_time) points: the pace
    :func:`eta_estimate` projects with (evaluations and saves included). None until there are
    two points with progress between them."""
    if len(points) < 2:
        return None
    pts = sorted(points)[-ETA_WINDOW:]
    (s0, t0), (s1, t1) = pts[0], pts[-1]
    if s1 <= s0 or t1 <= t0:
        return None
    return (s1 - s0) / (t1 - t0)


def eta_estimate(points: Sequence[tuple[int, float]], max_steps: int) -> Eta | None:
    """Seconds until ``max_steps`` from recent (step, wall_time) points of the current attempt.

    The estimate is the average pace over the newest :data:`ETA_WINDOW` points, evaluations and
    saves included (they recur, so they belong in the pace), which keeps it from swinging with
    each pause; the warm-up before them does not count. The range comes from the fastest and
    slowest of :data:`ETA_PARTS` consecutive parts of that window. None until there are two
    points with progress between them.
    """
    pace = recent_pace(points)
    if pace is None:
        return None
    pts = sorted(points)[-ETA_WINDOW:]
    left = max(0, max_steps - pts[-1][0])
    eta = left / pace
    rates = []
    size = max(1, (len(pts) - 1) // ETA_PARTS)
    for i in range(0, len(pts) - 1, size):
        (a, ta), (b, tb) = pts[i], pts[min(i + size, len(pts) - 1)]
        if b > a and tb > ta:
            rates.append((b - a) / (tb - ta))
    low = left / max(rates) if rates else eta
    high = left / min(rates) if rates else eta
    return Eta(seconds=eta, low=min(low, eta), high=max(high, eta))


def young_daly_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that loses the least time to saves and failures together.

    Young (1974) and Daly (2006): with a save that stalls training for ``C`` seconds and a
    mean time between failures ``M``, checkpointing every ``sqrt(2 C M)`` seconds minimises the
    expected time lost (the saves plus the work redone after a failure). A good approximation
    while ``C`` is much smaller than ``M``.

    Args:
        checkpoint_cost_s: seconds the training loop is blocked by one save.
        mtbf_s: mean seconds between failures.

    Returns:
        The recommended number of seconds between checkpoints.

    Raises:
        ValueError: when either argument is negative or not finite, naming it.
    """
    for name, value in (("checkpoint_cost_s", checkpoint_cost_s), ("mtbf_s", mtbf_s)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} = {value!r}: must be a finite number >= 0")
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)

@dataclass(frozen=True)
class Price:
    """A price snapshotted on the run at submit time."""

    usd_per_hour: float
    unit: str
