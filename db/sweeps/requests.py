"""What is asked of a sweep and of its trials, by a person (the CLI, the UI) or by the sweep itself
(orchestrator/sweeps/reconcile.py): start, pause, resume, cancel, change its limits, promote a
trial; stop a trial early (a prune). Each writes rows and moves states through the state machines
(db/sweeps/states.py, db/states.py); none starts or signals a process, and the caller commits.
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from db import DatabaseError
from db.models import Event, Run, Sweep, SweepStatusHistory, SweepTrial
from db.queries import resolve_row
from db.requests import RequestRefused, request_cancel, request_resume
from db.states import ACTIVE, STOPPING, TERMINAL, RunStatus, StopReason, transition
from db.sweeps.states import SWEEP_TERMINAL, SweepStatus, sweep_transition
from db.vocabulary.config import RunConfig


class SweepNotFound(DatabaseError):
    """No sweep matches the reference a person gave."""


def resolve_sweep(session: Session, ref: str | int) -> int:
    """A sweep id from an id (``3``, ``#3``) or a name (the newest sweep with that name)."""
    return resolve_row(session, Sweep, ref,
                       lambda what: SweepNotFound(f"no sweep {what}; `runyard sweep ls` lists the sweeps"))


def _sweep(session: Session, sweep_id: int) -> Sweep:
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise SweepNotFound(f"no sweep with id {sweep_id}; `runyard sweep ls` lists the sweeps")
    return sweep


def create_sweep(session: Session, config: RunConfig, rungs: list[int], now: float | None = None) -> Sweep:
    """Insert a RUNNING sweep of ``config`` (validated, its paths resolved, with its ``[sweep]``)
    whose early stop judges at ``rungs`` (steps); the scheduler's ``sweeps`` job starts its trials.
    The caller commits."""
    assert config.sweep is not None, "a sweep needs its [sweep] section"
    now = time.time() if now is None else now
    section = config.sweep
    sweep = Sweep(name=config.name, status=SweepStatus.RUNNING.value, status_reason="started",
                  base_json=config.base().to_json(), sweep_json=json.dumps(section.model_dump(mode="json",
                                                                                               by_alias=True)),
                  seed=section.seed, max_trials=section.max_trials, max_concurrent=section.max_concurrent,
                  rungs_json=json.dumps(rungs), created_at=now, updated_at=now)
    session.add(sweep)
    session.flush()
    session.add(SweepStatusHistory(sweep_id=sweep.id, from_status=None, to_status=sweep.status, reason="started",
                                   at=now))
    return sweep


def pause_sweep(session: Session, sweep_id: int, who: str = "user") -> str:
    """Start and promote nothing more until resumed (the trials training go on)."""
    sweep = _sweep(session, sweep_id)
    if not sweep_transition(session, sweep_id, SweepStatus.PAUSED, f"paused by {who}", expect=SweepStatus.RUNNING):
        raise RequestRefused(f"sweep {sweep_id} is {sweep.status}: only a RUNNING sweep can be paused")
    return (f"sweep {sweep_id} paused: no trial starts or is promoted until `runyard sweep resume {sweep_id}`; "
            "the trials training now go on")


def resume_sweep(session: Session, sweep_id: int, who: str = "user") -> str:
    """A paused sweep runs again."""
    sweep = _sweep(session, sweep_id)
    if not sweep_transition(session, sweep_id, SweepStatus.RUNNING, f"resumed by {who}", expect=SweepStatus.PAUSED):
        ended = SweepStatus(sweep.status) in SWEEP_TERMINAL
        hint = (" (an ended sweep stays ended: `runyard sweep promote` continues one of its trials, or start a new "
                "sweep from the same file)" if ended else "")
        raise RequestRefused(f"sweep {sweep_id} is {sweep.status}: only a PAUSED sweep can be resumed{hint}")
    return f"sweep {sweep_id} resumed"


def cancel_sweep(session: Session, sweep_id: int, who: str = "user") -> str:
    """End the sweep and cancel every trial not finished (training ones checkpoint and stop;
    pruned ones stay as they are, their checkpoints kept)."""
    sweep = _sweep(session, sweep_id)
    if not sweep_transition(session, sweep_id, SweepStatus.CANCELLED, f"cancelled by {who}"):
        raise RequestRefused(f"sweep {sweep_id} is already {sweep.status}")
    live = session.execute(select(Run.id).join(SweepTrial, SweepTrial.run_id == Run.id)
                           .where(SweepTrial.sweep_id == sweep_id,
                                  Run.status.not_in([s.value for s in TERMINAL]))).scalars().all()
    for run_id in live:
        request_cancel(session, run_id, who=f"{who} (sweep {sweep_id} cancelled)")
    return f"sweep {sweep_id} cancelled" + (f"; {len(live)} trial(s) being cancelled" if live else "")


def edit_sweep(session: Session, sweep_id: int, max_trials: int | None = None, max_concurrent: int | None = None,
               who: str = "user") -> str:
    """Change how many trials the sweep starts in all (``max_trials``) and at once
    (``max_concurrent``) while it runs. Fewer at once than now training stops none: it starts no
    new one until they are fewer.

    Raises:
        RequestRefused: the sweep has ended.
    """
    sweep = _sweep(session, sweep_id)
    if SweepStatus(sweep.status) in SWEEP_TERMINAL:
        raise RequestRefused(f"sweep {sweep_id} is {sweep.status}: an ended sweep's limits no longer matter; "
                             "start a new sweep from the same file")
    changes = []
    values: dict[str, Any] = {"updated_at": time.time()}
    if max_trials is not None:
        changes.append(f"max_trials {sweep.max_trials} -> {max_trials}")
        values["max_trials"] = max_trials
    if max_concurrent is not None:
        changes.append(f"max_concurrent {sweep.max_concurrent} -> {max_concurrent}")
        values["max_concurrent"] = max_concurrent
    session.execute(update(Sweep).where(Sweep.id == sweep_id).values(**values)
                    .execution_options(synchronize_session="fetch"))
    session.add(SweepStatusHistory(sweep_id=sweep_id, from_status=sweep.status, to_status=sweep.status,
                                   reason=f"edited by {who}: {', '.join(changes)}", at=values["updated_at"]))
    return f"sweep {sweep_id}: {', '.join(changes)}"


def trial_of(session: Session, sweep_id: int, number: int) -> SweepTrial:
    """Trial ``number`` of the sweep.

    Raises:
        SweepNotFound: the sweep has no such trial.
    """
    trial = session.scalar(select(SweepTrial).where(SweepTrial.sweep_id == sweep_id, SweepTrial.number == number))
    if trial is None:
        raise SweepNotFound(f"sweep {sweep_id} has no trial {number}; `runyard sweep show {sweep_id}` lists them")
    return trial


def promote(session: Session, trial: SweepTrial, who: str) -> int:
    """Continue a PRUNED trial from its newest verified checkpoint (a resume of its run, whose
    steps so far are kept: not trained or counted again). The caller commits.

    Returns:
        The step it continues from.

    Raises:
        RequestRefused: the trial has no run, is not PRUNED, or has no checkpoint to continue from.
    """
    if trial.run_id is None:
        raise RequestRefused(f"trial {trial.number} has no run ({trial.error or 'deleted'})")
    run = session.get(Run, trial.run_id)
    if run is None or run.status != RunStatus.PRUNED.value:
        status = run.status if run is not None else "gone"
        raise RequestRefused(f"trial {trial.number} (run {trial.run_id}) is {status}: only a PRUNED trial can be "
                             "promoted")
    step = request_resume(session, trial.run_id, who=who)
    trial.promoted += 1
    session.add(Event(run_id=trial.run_id, at=time.time(), kind="promote",
                      message=f"promoted by {who}: continues from step {step}"))
    return step


def resume_or_promote(session: Session, run_id: int, who: str, checkpoint_id: int | None = None) -> int:
    """Resume a run (:func:`db.requests.request_resume`); a PRUNED trial resumed from its newest
    verified checkpoint is promoted (:func:`promote`, as `runyard sweep promote` does), so its sweep
    counts the promotion. The caller commits.

    Returns:
        The step it continues from (0: from the start).
    """
    run = session.get(Run, run_id)
    trial = session.scalar(select(SweepTrial).where(SweepTrial.run_id == run_id))
    if checkpoint_id is None and trial is not None and run is not None and run.status == RunStatus.PRUNED.value:
        return promote(session, trial, who)
    return request_resume(session, run_id, who=who, checkpoint_id=checkpoint_id)


def request_prune(session: Session, trial: SweepTrial, why: dict[str, Any], who: str) -> bool:
    """Stop a trial early, gracefully: a training run goes PAUSING with ``stop_mode = "prune"``
    (the ranks finish the step, checkpoint and exit; it ends PRUNED), a queued or retrying one is
    PRUNED at once. ``why`` is kept on the trial for its sentence (:func:`prune_words`). The
    caller commits.

    Returns:
        Whether the run was moved (False: it ended, or is being stopped, meanwhile).
    """
    run = session.get(Run, trial.run_id) if trial.run_id is not None else None
    if run is None:
        return False
    status = RunStatus(run.status)
    trial.prune_json = json.dumps(why)
    words = _why_words(why)
    if status in (RunStatus.QUEUED, RunStatus.RETRYING):
        moved = transition(session, run.id, RunStatus.PRUNED, f"stopped early by {who} before it ran ({words})",
                           expect=status)
    elif status in ACTIVE and status not in STOPPING:
        run.stop_mode = StopReason.PRUNE.value
        moved = transition(session, run.id, RunStatus.PAUSING, f"stopping early: {who} ({words})", expect=status)
    else:
        return False
    if moved:
        session.add(Event(run_id=run.id, at=time.time(), kind="prune", message=f"stopped early by {who}: {words}"))
    return moved


def _why_words(why: dict[str, Any]) -> str:
    """A prune's reason in words: ``rung 1 at step 40: eval_loss 0.52, cut 0.41``."""
    if "why" in why:
        return str(why["why"])
    value = "none recorded" if why.get("value") is None else f"{why['value']:.6g}"
    cut = "" if why.get("cut") is None else f", cut {why['cut']:.6g}"
    return f"rung {why.get('rung')} at step {why.get('step')}: {why.get('metric', 'objective')} {value}{cut}"


def prune_words(session: Session, run_id: int) -> str:
    """Who stopped the run early and why, for its sentence: ``sweep 3 (rung 1 at step 40:
    eval_loss 0.52, cut 0.41)``."""
    trial = session.scalar(select(SweepTrial).where(SweepTrial.run_id == run_id))
    if trial is None:
        return "its sweep"
    why = json.loads(trial.prune_json) if trial.prune_json else {}
    return f"sweep {trial.sweep_id}" + (f" ({_why_words(why)})" if why else "")
