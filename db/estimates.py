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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, and_, case, func, select
from sqlalchemy.orm import Session
from typing_extensions import Unpack

from db import metricstore
from db.models import Attempt, Checkpoint, Run
from db.states import ACTIVE, STOPPING, RunStatus
from db.vocabulary.config import DEFAULT_KIND, workload_class
from db.vocabulary.cost import ETA_WINDOW, Price
from db.vocabulary.eta import MACHINE_RESTARTS, Restart, restart_ahead
from db.vocabulary.eta import forecast as eta_forecast
from db.vocabulary.inventory import Inventory
from db.vocabulary.queue_forecast import Holder, Start, Waiting, forecast
from db.vocabulary.scheduler_file import read_scheduler_file
from db.vocabulary.settings import Settings, SettingsError, load_settings

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
# What a queued run that Slurm will place says, and one on a machine whose devices are not known.
SLURM_BASIS = "Slurm decides when it starts (runyard has no estimate of the cluster's queue)"
NO_MACHINE_BASIS = "this machine's devices are not known yet (no scheduler has started on this data folder)"
STOPPING_S = 30.0  # a run being cancelled or paused frees its devices within about this long
AnyRow = Row[Unpack[tuple[Any, ...]]]
# What a pace is measured from, of an attempt.
_PACE_COLUMNS = (Attempt.run_id, Attempt.started_at, Attempt.first_step_at, Attempt.ended_at, Attempt.progress_at,
                 Attempt.last_step, Attempt.resume_step)


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


def _measured(attempts: Sequence[Any]) -> tuple[float, float | None] | None:
    """(steps per second over the attempt that trained longest, median start-up in seconds), from
    attempts (rows of :data:`_PACE_COLUMNS`, or ORM objects)."""
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
    return start_estimates(session, {0: (config, from_step)}, price)[0]


def start_estimates(session: Session, wanted: Mapping[int, tuple[Mapping[str, Any], int]],
                    price: Price | None = None) -> dict[int, StartEstimate]:
    """:func:`start_estimate` for many runs at once (the queued runs a forecast needs), in two
    statements however many there are: the newest :data:`LOOK_BACK_RUNS` started runs of each
    number of ranks, then the attempts of those of the same workload.

    Args:
        session: Where to read.
        wanted: ``(config, from_step)`` by run id, the config as ``RunConfig.as_dict()`` gives it.
        price: The price the estimates carry (the cost is not what a forecast reads).

    Returns:
        The estimate by run id, for every run of ``wanted``.
    """
    price = price or Price(usd_per_hour=0.0, unit="")
    ranks = {rid: _ranks(config) for rid, (config, _) in wanted.items()}
    if not wanted:
        return {}
    newest = (select(Run.id, Run.name, Run.config_json, Run.nproc,
                     func.row_number().over(partition_by=Run.nproc, order_by=Run.id.desc()).label("nth"))
              .where(Run.nproc.in_(sorted(set(ranks.values()))), Run.started_at.is_not(None)).subquery())
    earlier = session.execute(select(newest.c.id, newest.c.name, newest.c.config_json, newest.c.nproc)
                              .where(newest.c.nth <= LOOK_BACK_RUNS).order_by(newest.c.id.desc())).all()
    shapes = {run_id: (name, nproc, _pace_shape(json.loads(config_json)))
              for run_id, name, config_json, nproc in earlier}
    wanted_shapes = {rid: _pace_shape(config) for rid, (config, _) in wanted.items()}
    workloads = {shape[0] for shape in wanted_shapes.values()}
    alike = [run_id for run_id, (_, _, shape) in shapes.items() if shape[0] in workloads]
    attempts: dict[int, list[AnyRow]] = {run_id: [] for run_id in alike}
    if alike:
        for attempt in session.execute(select(*_PACE_COLUMNS).where(Attempt.run_id.in_(alike))):
            attempts[attempt.run_id].append(attempt)
    measured = {run_id: _measured(found) for run_id, found in attempts.items()}
    # Runs queued from one config share their candidates: found once per (ranks, shape).
    candidates: dict[tuple[int, tuple[str, str]], tuple[list[tuple[int, str]], list[tuple[int, str]]]] = {}
    out = {}
    for rid, (config, from_step) in wanted.items():
        shape = wanted_shapes[rid]
        if (ranks[rid], shape) not in candidates:
            same = [(run_id, name, other) for run_id, (name, nproc, other) in shapes.items() if nproc == ranks[rid]]
            candidates[ranks[rid], shape] = (
                [(run_id, name) for run_id, name, other in same if other == shape],
                [(run_id, name) for run_id, name, other in same if other != shape and other[0] == shape[0]])
        exact, rough = candidates[ranks[rid], shape]
        out[rid] = _estimate_from(config, from_step, price, exact, rough, measured)
    return out


def _ranks(config: Mapping[str, Any]) -> int:
    """Every rank of the run (``Run.nproc``)."""
    launch = config.get("launch", {})
    return int(launch.get("nproc_per_node") or 1) * int(launch.get("nnodes") or 1)


def _estimate_from(config: Mapping[str, Any], from_step: int, price: Price, exact: list[tuple[int, str]],
                   rough: list[tuple[int, str]],
                   measured: Mapping[int, tuple[float, float | None] | None]) -> StartEstimate:
    """The estimate of ``config`` from the first alike run (newest first) with a measured pace."""
    workload = config.get("workload", {})
    script = workload.get("kind") == "script"
    last = int((workload.get("max_steps") if script else config.get("train", {}).get("max_steps")) or 0)
    from_step = from_step if last else 0
    steps = max(0, last - from_step)
    for candidates, is_exact in ((exact, True), (rough, False)):
        for run_id, name in candidates:
            pace = measured.get(run_id)
            if pace is None:
                continue
            rate, startup = pace
            seconds = (startup or 0.0) + steps / rate if last else None
            return StartEstimate(
                steps=steps, usd_per_hour=price.usd_per_hour, price_unit=price.unit, seconds=seconds,
                cost_usd=seconds * price.usd_per_hour / 3600.0 if seconds is not None else None,
                steps_per_s=rate, startup_s=startup, like_run=run_id, like_name=name, exact=is_exact,
                from_step=from_step)
    return StartEstimate(steps=steps, usd_per_hour=price.usd_per_hour, price_unit=price.unit, from_step=from_step)


def published_machine(settings: Settings | None = None) -> Inventory | None:
    """The devices the scheduler published in its heartbeat file (db/vocabulary/scheduler_file.py)
    in the data folder (``RUNYARD_HOME``'s unless ``settings`` say another); None before a
    scheduler has started there."""
    try:
        settings = settings or load_settings()
    except SettingsError:
        return None
    published = (read_scheduler_file(settings.scheduler_file) or {}).get("inventory")
    if not isinstance(published, dict):
        return None
    try:
        return Inventory.from_json(published)
    except (KeyError, TypeError, ValueError):
        return None  # an older scheduler's record


def queue_starts(session: Session, now: float, machine: Inventory | None, holding: list[AnyRow] | None = None,
                 points: Mapping[tuple[int, int, int], list[tuple[int, float, float]]] | None = None,
                 ) -> dict[int, Start]:
    """When each queued run should start (db/vocabulary/queue_forecast.py walks the queue), read in
    a fixed number of statements: the queued runs, the runs holding devices with their attempts,
    the checkpoints resumes start from, the alike earlier runs (:func:`start_estimates`) and the
    holders' newest progress points.

    Args:
        session: Where to read.
        now: The time of the forecast.
        machine: The devices runs are admitted against (:func:`published_machine`); None when
            not known, and then no local run gets a time.
        holding: :func:`holding_runs`, when the caller read them already.
        points: The holders' newest progress points (``metricstore.recent_progress``), when the
            caller read them already with its own (the Runs list reads its live runs' anyway).

    Returns:
        A :class:`~db.vocabulary.queue_forecast.Start` by run id, for every queued run.
    """
    queued = session.execute(
        select(Run.id, Run.nproc, Run.executor, Run.config_json, Run.resume_checkpoint_id)
        .where(Run.status == RunStatus.QUEUED.value).order_by(Run.id)).all()
    starts = {r.id: Start(None, None, SLURM_BASIS, here=False) for r in queued if r.executor == "slurm"}
    local = [r for r in queued if r.executor != "slurm"]
    if not local:
        return starts
    if machine is None:
        return starts | {r.id: Start(None, None, NO_MACHINE_BASIS) for r in local}
    holding = holding_runs(session) if holding is None else holding
    resumes = {r.resume_checkpoint_id for r in local if r.resume_checkpoint_id is not None}
    resume_steps: dict[int, int] = dict(session.execute(
        select(Checkpoint.id, Checkpoint.step).where(Checkpoint.id.in_(resumes))).all()) if resumes else {}
    wanted = {r.id: (json.loads(r.config_json), resume_steps.get(r.resume_checkpoint_id or -1, 0)) for r in local}
    wanted |= {h.id: (json.loads(h.config_json), h.resume_step or 0) for h in holding}
    estimates = start_estimates(session, wanted)
    if points is None:
        points = metricstore.recent_progress(session, [(h.id, h.number, 0) for h in holding], limit=ETA_WINDOW)
    restarts = _restarts_ahead(session, [h for h in holding if h.status == RunStatus.RETRYING.value], now)
    holders = [_holder(h, points.get((h.id, h.number, 0), []), estimates[h.id], now, restarts.get(h.id))
               for h in holding]
    waiting = [Waiting(r.id, r.nproc, estimates[r.id].seconds) for r in local]
    return starts | forecast(holders, waiting, machine.slots, now)


def machine_startups(session: Session) -> list[float]:
    """Launch to first step of this machine's newest restarts (any run's attempt after its first),
    the stand-in for a run that has not restarted yet (db/vocabulary/eta.py)."""
    rows = session.execute(
        select(Attempt.started_at, Attempt.first_step_at).where(Attempt.number > 1, Attempt.first_step_at.is_not(None))
        .order_by(Attempt.started_at.desc()).limit(MACHINE_RESTARTS))
    return [max(0.0, first - started) for started, first in rows if first is not None]


def _restarts_ahead(session: Session, retrying: Sequence[AnyRow], now: float) -> dict[int, Restart]:
    """The restart each retrying holder is about to pay, as its own page's ETA counts it (its
    backoff left, a start-up, the steps from its newest usable checkpoint): three statements, and
    none without a retrying holder."""
    if not retrying:
        return {}
    ids = [h.id for h in retrying]
    startups: dict[int, list[tuple[int, float]]] = {run_id: [] for run_id in ids}
    for run_id, number, started, first in session.execute(
            select(Attempt.run_id, Attempt.number, Attempt.started_at, Attempt.first_step_at)
            .where(Attempt.run_id.in_(ids), Attempt.first_step_at.is_not(None))):
        if first is not None:  # the query's filter: for the type checker
            startups[run_id].append((number, first - started))
    ok = and_(Checkpoint.verified, ~Checkpoint.deleted, Checkpoint.refused_reason.is_(None))
    usable: dict[int, int] = {run_id: step for run_id, step in session.execute(
        select(Checkpoint.run_id, func.max(case((ok, Checkpoint.step)))).where(Checkpoint.run_id.in_(ids))
        .group_by(Checkpoint.run_id)) if step is not None}
    machine = machine_startups(session)
    found = {h.id: restart_ahead(RunStatus.RETRYING.value, startups[h.id], h.retry_at, now, machine, usable.get(h.id))
             for h in retrying}
    return {run_id: restart for run_id, restart in found.items() if restart is not None}


def holding_runs(session: Session) -> list[AnyRow]:
    """The local runs that hold devices (an active one) or will take them back first (a retrying
    one), each with its newest attempt."""
    rows = session.execute(
        select(Run.id, Run.nproc, Run.status, Run.max_steps, Run.config_json, Run.retry_at, Attempt.number,
               Attempt.started_at, Attempt.resume_step)
        .join(Attempt, Attempt.run_id == Run.id)
        .where(Run.executor != "slurm",
               Run.status.in_([s.value for s in (*ACTIVE, RunStatus.RETRYING)]))
        .order_by(Run.id, Attempt.number)).all()
    return list({row.id: row for row in rows}.values())  # the newest attempt of each


def _holder(row: AnyRow, points: list[tuple[int, float, float]], alike: StartEstimate, now: float,
            coming: Restart | None = None) -> Holder:
    """A run holding devices, with its predicted end: its own pace's ETA from its newest progress
    point (a retrying run's with the restart it is about to pay, ``coming``: from now, as its page
    shows it; without one known, from when it restarts), else the pace of the most alike earlier
    run from when its attempt started, else not known. A run being stopped ends within moments."""
    status = RunStatus(row.status)
    if status in STOPPING:
        return Holder(row.id, row.nproc, now + STOPPING_S, started_at=row.started_at)
    restart = max(row.retry_at or now, now) if status is RunStatus.RETRYING else None
    # The same prediction as the run's own page shows, and its band's slow end for a run that outlives it.
    eta = eta_forecast([(int(s), float(t)) for s, _, t in points], row.max_steps, coming) if row.max_steps else None
    if eta is not None:
        base = now if coming is not None else restart if restart is not None else max(t for _, _, t in points)
        return Holder(row.id, row.nproc, base + eta.seconds, base + eta.high, row.started_at)
    if alike.seconds is not None:
        base = restart if restart is not None else row.started_at
        return Holder(row.id, row.nproc, base + alike.seconds, started_at=row.started_at)
    return Holder(row.id, row.nproc, None, started_at=row.started_at)
