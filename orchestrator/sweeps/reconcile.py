"""One pass over a sweep: what its trials reached, then what the sweep does next.

Run by the scheduler's ``sweeps`` job (orchestrator/scheduler/service.py, every
:data:`SWEEP_EVERY_S`; tests call :meth:`SweepJob.run` directly). Each pass reads the sweep and its
trials as plain values, decides, and applies each decision with one conditional write, so a
scheduler killed at any moment (while it asks for a trial, prunes one or promotes one) loses
nothing and duplicates nothing, and the next pass, of this scheduler or another, goes on:

1. rungs (orchestrator/sweeps/rungs.py): the values trials reached at the rungs, each training
   trial judged at the newest it passed and stopped early below the cut; a finished trial's
   objective.
2. what next (:data:`RULES`, over a :class:`Plan`): the breaker or the budget stops the sweep;
   a paused sweep, or one with ``max_concurrent`` trials training, waits; a pruned trial now among
   the best of its rung is promoted before any new trial starts; a new trial starts (the
   searcher's suggestion, orchestrator/sweeps/trials.py); with nothing training and nothing left,
   the sweep is FINISHED. Each answer is applied by one function (:data:`APPLIERS`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol

from sqlalchemy import or_, select, union, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from db.models import Run, Sweep, SweepTrial
from db.requests import RequestRefused
from db.states import TERMINAL, RunStatus
from db.sweeps.queries import TRAINING, spent, trials_of
from db.sweeps.requests import promote, request_prune, trial_of
from db.sweeps.states import SweepStatus, sweep_transition
from db.vocabulary.config.sweep import SweepConfig
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator import OrchestratorError
from orchestrator.sweeps import asha
from orchestrator.sweeps.budget import failures, limit_reached, tripped
from orchestrator.sweeps.objective import newest_checkpoints
from orchestrator.sweeps.rungs import ACTIVE_SWEEPS, Sweeping, record_end, record_rungs, records
from orchestrator.sweeps.searchers import history_json, params_key, suggest
from orchestrator.sweeps.trials import create_trial, told

logger = logging.getLogger(__name__)

SWEEP_EVERY_S = 2.0


class ErrorSink(Protocol):
    """Where a pass's failures go (the scheduler's RepeatedErrors: logged once, then counted)."""

    def failed(self, where: str, exc: BaseException) -> None: ...

    def succeeded(self, where: str) -> None: ...


@dataclass(frozen=True)
class Plan:
    """What a sweep's next step is decided from, in plain values."""

    status: str
    active: int  # trials training: queued, starting, running, retrying or being stopped
    held: int  # trials a person paused (they neither train nor have ended)
    started: int  # trials made so far: the next one's number
    max_trials: int
    max_concurrent: int
    breaker: str | None  # the breaker's sentence, once tripped
    budget: str | None  # the budget's sentence, once reached
    promotable: tuple[int, ...]  # pruned trials now among the best of their rung, best first
    exhausted: bool = False  # the searcher has nothing new to suggest

    @property
    def running(self) -> bool:
        return self.status == SweepStatus.RUNNING.value


class Next(Enum):
    """What a sweep does next; the value is its sentence."""

    BREAKER = "stopped: {breaker}"
    BUDGET = "stopped: {budget}"
    HELD = "paused: no trial starts or is promoted"
    FULL = "{active} trial(s) training (max_concurrent = {max_concurrent}): the next starts when one ends"
    PROMOTE = "promoting a stopped trial now among the best of its rung"
    START = "starting trial {started}"
    FINISH = "finished: every trial has ended and none is left to start"
    WAIT = "waiting for {active} trial(s) training and {held} paused by a person"

    @property
    def goes_on(self) -> bool:
        """Whether the pass decides again after applying it (one trial started, more may)."""
        return self in (Next.PROMOTE, Next.START)


# The decision, one row a rule: the first whose test holds is what the sweep does next.
RULES: tuple[tuple[Next, Callable[[Plan], bool]], ...] = (
    (Next.BREAKER, lambda p: p.running and p.breaker is not None),
    (Next.BUDGET, lambda p: p.running and p.budget is not None),
    (Next.HELD, lambda p: not p.running),
    (Next.FULL, lambda p: p.active >= p.max_concurrent),
    (Next.PROMOTE, lambda p: bool(p.promotable)),
    (Next.START, lambda p: p.started < p.max_trials and not p.exhausted),
    (Next.FINISH, lambda p: p.active == 0 and p.held == 0),
    (Next.WAIT, lambda p: True),
)


def decide(plan: Plan) -> Next:
    """The first rule of :data:`RULES` that holds for ``plan``."""
    return next(found for found, holds in RULES if holds(plan))


def words(found: Next, plan: Plan) -> str:
    return found.value.format(**vars(plan))


def promotable(s: Sweeping) -> tuple[int, ...]:
    """The trials ASHA stopped at a rung that now rank among its best ``floor(n / reduction)``,
    deepest rung first, then best first (asha.promotable)."""
    early = s.section.early_stop
    if early is None:
        return ()
    found = []
    for t in s.trials:
        k = t["rung"]
        if t["status"] != RunStatus.PRUNED.value or k is None or "rung" not in (t["prune"] or {}):
            continue  # stopped by a budget or a breaker, or not pruned at all
        value = t["rungs"][k]["value"]
        if asha.promotable(value, s.values_at(k), early.reduction, s.section.goal):
            found.append((-k, -asha.score(value, s.section.goal), t["number"]))
    return tuple(number for *_, number in sorted(found))


class StalePass(OrchestratorError):
    """What this pass read has been overtaken (another scheduler made the same trial): it ends,
    and the next pass reads again."""


# -- applying each answer ----------------------------------------------------------------------


def _stop(s: Sweeping, plan: Plan, found: Next, job: SweepJob) -> Plan:
    """The breaker or the budget: the sweep STOPPED with its sentence, and every trial training
    stopped gracefully (each checkpoints and ends PRUNED: a person can still promote it)."""
    sentence = words(found, plan)
    if not sweep_transition(s.session, s.sweep.id, SweepStatus.STOPPED, sentence, expect=SweepStatus.RUNNING):
        return replace(plan, status=s.sweep.status)
    for t in s.trials:
        if t["status"] in TRAINING and t["run_id"] is not None:
            request_prune(s.session, trial_of(s.session, s.sweep.id, t["number"]), {"why": sentence},
                          f"sweep {s.sweep.id}")
    logger.warning("sweep %d %s", s.sweep.id, sentence)
    return replace(plan, status=SweepStatus.STOPPED.value)


def _say(s: Sweeping, plan: Plan, found: Next, job: SweepJob) -> Plan:
    """Waiting: a running sweep says what for (written only when it changes)."""
    if plan.running and s.sweep.status_reason != (sentence := words(found, plan)):
        s.session.execute(update(Sweep).where(Sweep.id == s.sweep.id, Sweep.status == plan.status)
                          .values(status_reason=sentence))
    return plan


def _promote(s: Sweeping, plan: Plan, found: Next, job: SweepJob) -> Plan:
    """The best pruned trial continues from its checkpoint (a resume of its run)."""
    number, rest = plan.promotable[0], plan.promotable[1:]
    row = trial_of(s.session, s.sweep.id, number)
    k = row.rung or 0
    values = s.values_at(k)
    early = s.section.early_stop
    kept = asha.keep(len(values), early.reduction if early else 1)
    try:
        step = promote(s.session, row, f"sweep {s.sweep.id} (rung {k}: among the best {kept} of {len(values)})")
    except RequestRefused as exc:  # its checkpoint is gone, or its run moved meanwhile
        logger.warning("sweep %d: trial %d not promoted: %s", s.sweep.id, number, exc)
        return replace(plan, promotable=rest)
    logger.info("sweep %d: trial %d promoted at rung %d; it continues from step %d", s.sweep.id, number, k, step)
    job.queued += 1
    return replace(plan, promotable=rest, active=plan.active + 1)


def _start(s: Sweeping, plan: Plan, found: Next, job: SweepJob) -> Plan:
    """The searcher's suggestion for the next trial, made a trial and a queued run in one commit."""
    number = plan.started
    history = [told(t, s.rungs) for t in s.trials] if s.section.searcher == "tpe" else []
    params = suggest(s.section, s.sweep.seed, number, history, {params_key(t["params"]) for t in s.trials})
    if params is None:
        return replace(plan, exhausted=True)
    if s.session.scalar(select(Sweep.status).where(Sweep.id == s.sweep.id)) != SweepStatus.RUNNING.value:
        raise StalePass(f"sweep {s.sweep.id} was paused, stopped or cancelled meanwhile")
    try:
        trial = create_trial(s.session, s.sweep, number, params, history_json(history), job.settings, job.inventory)
        s.session.commit()
    except IntegrityError as exc:
        s.session.rollback()
        raise StalePass(f"sweep {s.sweep.id}: trial {number} was made by another scheduler") from exc
    logger.info("sweep %d: trial %d %s: %s", s.sweep.id, number,
                f"queued as run {trial.run_id}" if trial.run_id else f"refused ({trial.error})", params)
    s.trials[:] = trials_of(s.session, s.sweep.id)
    job.queued += trial.run_id is not None
    return replace(plan, started=number + 1, active=plan.active + (trial.run_id is not None))


def _finish(s: Sweeping, plan: Plan, found: Next, job: SweepJob) -> Plan:
    if sweep_transition(s.session, s.sweep.id, SweepStatus.FINISHED, words(found, plan), expect=SweepStatus.RUNNING):
        logger.info("sweep %d finished: %d trial(s)", s.sweep.id, plan.started)
    return replace(plan, status=SweepStatus.FINISHED.value)


APPLIERS: dict[Next, Callable[[Sweeping, Plan, Next, SweepJob], Plan]] = {
    Next.BREAKER: _stop, Next.BUDGET: _stop, Next.HELD: _say, Next.FULL: _say, Next.PROMOTE: _promote,
    Next.START: _start, Next.FINISH: _finish, Next.WAIT: _say,
}


# -- the job -----------------------------------------------------------------------------------


class SweepJob:
    """The scheduler's ``sweeps`` job: :meth:`run` passes over every sweep that needs one.

    Args:
        sessions: The scheduler's database.
        settings: Where runs' folders go (a trial's run is made there).
        inventory: This machine, which a trial's config is checked against like any submit.
        errors: Where one sweep's failure goes (the others' passes go on); None: raised.

    Attributes:
        queued: How many runs its passes have queued (trials started or promoted): the scheduler's
            service brings the tick forward when a pass queued one, so it launches at once.
    """

    def __init__(self, sessions: sessionmaker[Session], settings: Settings, inventory: Inventory,
                 errors: ErrorSink | None = None) -> None:
        self.sessions, self.settings, self.inventory, self.errors = sessions, settings, inventory, errors
        self.queued = 0

    def run(self) -> None:
        """One pass over each sweep that is running or paused, or has a trial not yet settled."""
        with self.sessions() as session:
            due = self.due(session)
        for sweep_id in due:
            try:
                with self.sessions() as session:
                    self.reconcile(session, sweep_id)
            except StalePass as stale:
                logger.info("%s; read again at the next pass", stale)
            except Exception as exc:  # one sweep's failure must not stop the others' passes
                if self.errors is None:
                    raise
                self.errors.failed(f"sweep {sweep_id}", exc)
            else:
                if self.errors is not None:
                    self.errors.succeeded(f"sweep {sweep_id}")

    @staticmethod
    def due(session: Session) -> list[int]:
        """The sweeps a pass visits: running or paused ones, and ended ones with a trial still
        training, or finished without its objective recorded (a promotion by hand, a late end)."""
        unsettled = (select(SweepTrial.sweep_id).join(Run, Run.id == SweepTrial.run_id)
                     .where(or_(Run.status.not_in([s.value for s in TERMINAL]),
                                (Run.status == RunStatus.SUCCEEDED.value) & SweepTrial.objective_step.is_(None))))
        active = select(Sweep.id).where(Sweep.status.in_(ACTIVE_SWEEPS))
        return sorted(session.scalars(union(active, unsettled)).all())

    def reconcile(self, session: Session, sweep_id: int) -> None:
        """One sweep's pass: its trials' rungs and ends recorded (each commit on its own), then,
        for a running or paused sweep, what it does next, decided and applied until it waits."""
        sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            return
        section = SweepConfig.model_validate(json.loads(sweep.sweep_json))
        s = Sweeping(session, sweep, section, json.loads(sweep.rungs_json), trials_of(session, sweep_id))
        newest = newest_checkpoints(session, [t["run_id"] for t in s.trials if t["run_id"] is not None])
        for t in s.trials:
            if s.rungs and (passed := records(s, t, newest.get(t["run_id"]))):
                record_rungs(s, t, passed)
                session.commit()
            if t["status"] == RunStatus.SUCCEEDED.value and t["objective_step"] is None:
                record_end(s, t)
                session.commit()
        if sweep.status not in ACTIVE_SWEEPS:
            return
        plan = self.plan(s)
        while True:
            found = decide(plan)
            plan = APPLIERS[found](s, plan, found, self)
            session.commit()
            if not found.goes_on:
                return

    @staticmethod
    def plan(s: Sweeping) -> Plan:
        """What the sweep's next step is decided from, read once a pass."""
        trials, section = s.trials, s.section
        return Plan(
            status=s.sweep.status,
            active=sum(t["status"] in TRAINING for t in trials),
            held=sum(t["status"] == RunStatus.PAUSED.value for t in trials),
            started=max((t["number"] for t in trials), default=-1) + 1,
            max_trials=s.sweep.max_trials, max_concurrent=s.sweep.max_concurrent,
            breaker=tripped(failures(s.session, trials), section.budget.max_failed),
            budget=limit_reached(spent(trials, s.sweep, time.time()), section.budget),
            promotable=promotable(s),
        )
