"""How long and how much a run will take, before it is started: the New run page's estimate.

The pace comes from the most alike earlier run that trained on this database: same workload
(model, data, script), same ranks, batch size, precision and the other settings that change a
step's time. A run of the same workload and ranks with other settings is used when no alike
one exists, and the estimate says it is rough. Without either there is no pace, and only the
price per hour is known.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Attempt, Run
from db.vocabulary.config import DEFAULT_KIND, workload_class
from db.vocabulary.cost import Price

# The settings, besides the whole workload section, that change how long a step takes.
PACE_KEYS = (("launch", "nproc_per_node"), ("launch", "nnodes"), ("launch", "executor"), ("launch", "backend"),
             ("train", "batch_size"), ("train", "precision"), ("train", "compile"),
             ("train", "activation_checkpointing"), ("train", "grad_accum"), ("train", "log_every"),
             ("train", "eval_every"), ("parallel", "strategy"))
# Keys added after runs were stored: a stored config without one had this value.
PACE_DEFAULTS: dict[tuple[str, str], Any] = {("launch", "nnodes"): 1, ("launch", "executor"): "local"}
# The workload keys that say what is trained, not for how long.
NOT_PACE = frozenset({"max_steps", "hidden"})
LOOK_BACK_RUNS = 200


@dataclass(frozen=True)
class StartEstimate:
    """What a run of ``steps`` steps should take, and cost at ``usd_per_hour``.

    ``steps`` are those it will train: from ``from_step`` (a fork's or a resume's checkpoint, 0 for
    a fresh run) to its last. ``seconds`` and ``cost_usd`` are None without a pace or without a
    total number of steps. ``like_run`` is the earlier run the pace comes from; ``exact`` whether it
    was alike in every setting that changes a step's time.
    """

    steps: int
    usd_per_hour: float
    price_unit: str
    seconds: float | None = None
    cost_usd: float | None = None
    steps_per_s: float | None = None
    startup_s: float | None = None
    like_run: int | None = None
    like_name: str | None = None
    exact: bool = False
    from_step: int = 0


def _pace_shape(config: Mapping[str, Any]) -> tuple[str, str]:
    """(the workload as text, the other pace settings as text): equal shapes train at one pace."""
    stored = config.get("workload", {})
    # Only its kind's keys: a run stored before the per-kind models has every kind's keys.
    model = workload_class(stored.get("kind", DEFAULT_KIND))
    workload = {k: v for k, v in stored.items()
                if k not in NOT_PACE and (model is None or k in model.model_fields)}
    rest = [config.get(section, {}).get(key, PACE_DEFAULTS.get((section, key))) for section, key in PACE_KEYS]
    return json.dumps(workload, sort_keys=True, default=str), json.dumps(rest, default=str)


def _measured(attempts: list[Attempt]) -> tuple[float, float | None] | None:
    """(steps per second over the attempt that trained longest, median start-up in seconds)."""
    best: tuple[float, float] | None = None  # (seconds, steps)
    startups = []
    for a in attempts:
        if a.first_step_at is None:
            continue
        startups.append(a.first_step_at - a.started_at)
        end = a.ended_at or a.progress_at
        steps = (a.last_step or 0) - (a.resume_step or 0)
        if end is None or steps <= 0 or end <= a.first_step_at:
            continue
        if best is None or end - a.first_step_at > best[0]:
            best = (end - a.first_step_at, steps)
    if best is None:
        return None
    return best[1] / best[0], statistics.median(startups) if startups else None


def start_estimate(session: Session, config: Mapping[str, Any], price: Price, from_step: int = 0) -> StartEstimate:
    """The estimate for ``config`` (``RunConfig.as_dict()``) on this machine at ``price``.

    The run ends at ``train.max_steps`` for a built-in workload and ``workload.max_steps`` for a
    script (0: the script's own total, unknown before it runs); it starts at ``from_step`` (a fork
    from a checkpoint at step 3000 of 4000 trains 1,000 steps, not 4,000).
    """
    workload = config.get("workload", {})
    script = workload.get("kind") == "script"
    last = int((workload.get("max_steps") if script else config.get("train", {}).get("max_steps")) or 0)
    from_step = from_step if last else 0  # an unknown total has no known remainder either
    steps = max(0, last - from_step)
    base = StartEstimate(steps=steps, usd_per_hour=price.usd_per_hour, price_unit=price.unit, from_step=from_step)
    launch = config.get("launch", {})
    nproc = int(launch.get("nproc_per_node") or 1) * int(launch.get("nnodes") or 1)  # Run.nproc: every rank
    shape = _pace_shape(config)
    runs = session.execute(
        select(Run.id, Run.name, Run.config_json).where(Run.nproc == nproc, Run.started_at.is_not(None))
        .order_by(Run.id.desc()).limit(LOOK_BACK_RUNS)
    ).all()
    exact, rough = [], []
    for run_id, name, config_json in runs:
        other = _pace_shape(json.loads(config_json))
        if other == shape:
            exact.append((run_id, name))
        elif other[0] == shape[0]:
            rough.append((run_id, name))
    for candidates, alike in ((exact, True), (rough, False)):
        for run_id, name in candidates:
            attempts = list(session.scalars(select(Attempt).where(Attempt.run_id == run_id)))
            measured = _measured(attempts)
            if measured is None:
                continue
            rate, startup = measured
            seconds = (startup or 0.0) + steps / rate if last else None
            return StartEstimate(
                steps=steps, usd_per_hour=price.usd_per_hour, price_unit=price.unit, seconds=seconds,
                cost_usd=seconds * price.usd_per_hour / 3600.0 if seconds is not None else None,
                steps_per_s=rate, startup_s=startup, like_run=run_id, like_name=name, exact=alike,
                from_step=from_step,
            )
    return base
