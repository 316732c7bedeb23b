"""The arithmetic before Start (`runyard sweep preview FILE`, the New sweep form): how many trials,
how many reach each rung, what that is in full runs, and in device-hours and dollars at the pace
of the most alike run this database has seen (db/estimates.py).

With ASHA, ``n`` trials train to the first rung; of every ``reduction`` that reach a rung, one goes
on (at least one: the sweep's best always finishes), so ``n, n // r, n // r^2 ...`` train each
segment between two rungs, and the last to the end. The asynchronous version lets more through
while a rung holds fewer than ``reduction`` values, and promotes a stopped trial later: the numbers
are what the halving itself costs, the least the sweep will spend, not a bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from db.estimates import start_estimate
from db.queries import price_table
from db.vocabulary.config import RunConfig
from db.vocabulary.config.sweep import SweepConfig
from db.vocabulary.inventory import Inventory
from orchestrator.format import duration
from orchestrator.submission import run_price
from orchestrator.sweeps.asha import base_rungs, trial_steps
from orchestrator.sweeps.space import grid_size


def reaching(trials: int, rungs: Sequence[int], reduction: int) -> list[int]:
    """How many trials train each segment: to the first rung, from each rung to the next, and from
    the last to the end (``len(rungs) + 1`` numbers)."""
    counts = [trials]
    for _ in rungs:
        counts.append(max(1, counts[-1] // reduction) if counts[-1] else 0)
    return counts


def steps_trained(trials: int, rungs: Sequence[int], reduction: int, max_steps: int) -> int:
    """The steps every trial trains together: each segment's length times the trials training it."""
    bounds = [0, *rungs, max_steps]
    counts = reaching(trials, rungs, reduction)
    return sum(n * (end - start) for n, start, end in zip(counts, bounds[:-1], bounds[1:], strict=True))


@dataclass(frozen=True)
class Preview:
    """A sweep's arithmetic. ``device_hours``, ``usd`` and ``wall_hours`` are None without a pace
    (no alike run has trained on this database yet) or without a step count (a script's)."""

    trials: int
    max_concurrent: int
    max_steps: int
    rungs: list[dict[str, int]]  # {"rung", "step", "trials"}: how many reach each
    steps: int  # trained by every trial together
    full_runs: float  # steps / max_steps: what the sweep costs in runs of the base
    usd_per_hour: float  # of one trial, as its run would be priced now
    devices: int  # one trial's ranks
    seconds_per_step: float | None = None
    like_run: int | None = None  # the run the pace comes from
    device_hours: float | None = None
    usd: float | None = None
    wall_hours: float | None = None  # max_concurrent trials at a time, each waiting for none
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain data, for JSON and the form."""
        return asdict(self)


def trial_count(sweep: SweepConfig) -> int:
    """How many trials the sweep makes: ``max_trials``, or fewer for a smaller grid."""
    return min(sweep.max_trials, grid_size(sweep)) if sweep.searcher == "grid" else sweep.max_trials


def _notes(sweep: SweepConfig, device_hours: float | None, usd: float | None) -> list[str]:
    notes = []
    budget = sweep.budget
    for key, spent in (("gpu_hours", device_hours), ("usd", usd)):
        limit = float(getattr(budget, key))
        if limit and spent is not None and spent > limit:
            notes.append(f"sweep.budget.{key} = {limit:g} is reached before the end (about {spent:.3g} needed): "
                         "the trials training then stop early")
    if sweep.early_stop is not None:
        notes.append("ASHA lets more trials past a rung that holds fewer than `reduction` values, and promotes "
                     "stopped ones later: the steps are the halving's own, the least the sweep trains")
    return notes


def preview(session: Session | None, config: RunConfig, inventory: Inventory) -> Preview:
    """The arithmetic of the validated sweep ``config`` (with its ``[sweep]``) on this machine;
    ``session``: a database for the pace and the price table (None: no pace, default prices)."""
    assert config.sweep is not None, "a sweep's config has its [sweep]"
    sweep, base = config.sweep, config.base()
    trials, max_steps = trial_count(sweep), trial_steps(base)
    rungs = base_rungs(base, sweep.early_stop)
    reduction = sweep.early_stop.reduction if sweep.early_stop is not None else 1
    counts = reaching(trials, rungs, reduction)
    steps = steps_trained(trials, rungs, reduction, max_steps) if max_steps else 0
    price = run_price(base, inventory, price_table(session) if session is not None else {})
    out = Preview(trials=trials, max_concurrent=sweep.max_concurrent, max_steps=max_steps,
                  rungs=[{"rung": k, "step": step, "trials": counts[k]} for k, step in enumerate(rungs)],
                  steps=steps, full_runs=steps / max_steps if max_steps else 0.0, usd_per_hour=price.usd_per_hour,
                  devices=base.launch.world_size)
    estimate = start_estimate(session, base.as_dict(), price) if session is not None and max_steps else None
    if estimate is None or estimate.steps_per_s is None:
        return _with_notes(out, sweep)
    seconds = steps / estimate.steps_per_s + trials * (estimate.startup_s or 0.0)
    device_hours = seconds * out.devices / 3600.0
    usd = seconds * price.usd_per_hour / 3600.0
    wall = seconds / min(sweep.max_concurrent, trials or 1) / 3600.0
    return _with_notes(Preview(**{**asdict(out), "seconds_per_step": 1.0 / estimate.steps_per_s,
                                  "like_run": estimate.like_run, "device_hours": device_hours, "usd": usd,
                                  "wall_hours": wall}), sweep)


def preview_in(sessions: sessionmaker[Session] | None, config: RunConfig, inventory: Inventory) -> Preview:
    """:func:`preview` in a session of its own (``sessions`` None: no database yet, so no pace)."""
    if sessions is None:
        return preview(None, config, inventory)
    with sessions() as session:
        return preview(session, config, inventory)


def _with_notes(out: Preview, sweep: SweepConfig) -> Preview:
    return Preview(**{**asdict(out), "notes": _notes(sweep, out.device_hours, out.usd)})


def preview_lines(p: Preview) -> list[str]:
    """The arithmetic in words: what `runyard sweep preview` prints and the New sweep form shows."""
    lines = [f"{p.trials} trial(s), {p.max_concurrent} at a time, {p.max_steps} steps each at most "
             f"({p.devices} rank(s) a trial)"]
    lines += [f"  rung {r['rung']} at step {r['step']}: {r['trials']} trial(s) reach it" for r in p.rungs]
    lines.append(f"  {p.steps:,} steps in all: {p.full_runs:.3g} full run(s) of the base config")
    if p.device_hours is None:
        lines.append(f"  no pace yet (no alike run has trained here): ${p.usd_per_hour:.4g} an hour a trial")
    else:
        wall = duration((p.wall_hours or 0) * 3600).replace(" ", "")
        lines.append(f"  about {p.device_hours:.3g} GPU-hours, ${p.usd:.4g}, {wall} of wall time (the pace of run "
                     f"{p.like_run}: {p.seconds_per_step:.3g} s a step)")
    return lines + [f"  note: {note}" for note in p.notes]
