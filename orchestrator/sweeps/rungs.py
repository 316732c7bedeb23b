"""What a sweep's trials reached: their values at the rungs, judged as they pass one, and their
objective at their end (step 1 of a pass, orchestrator/sweeps/reconcile.py).

A rung counts for a trial once a verified checkpoint at or past its step exists (the step the
value is read at: ASHA's decisions are aligned to checkpoints a stopped trial continues from) and,
while the trial trains, its metric is logged that far (a value written late is not missed). A
trial training in a sweep that has not ended is judged at the newest rung it passed
(orchestrator/sweeps/asha.py) and stopped early when it falls below the cut. Every write is
conditional on not having been made: a pass made twice records once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from db.models import Sweep, SweepTrial
from db.sweeps.queries import TRAINING
from db.sweeps.requests import request_prune
from db.sweeps.states import SweepStatus
from db.vocabulary.config.sweep import SweepConfig
from orchestrator.sweeps import asha
from orchestrator.sweeps.objective import checkpoint_at_or_past, newest_logged, value_at

logger = logging.getLogger(__name__)

# A sweep whose trials are judged, promoted and started; an ended one's are only recorded.
ACTIVE_SWEEPS = (SweepStatus.RUNNING.value, SweepStatus.PAUSED.value)


@dataclass(frozen=True)
class Sweeping:
    """One sweep in a pass: its row, its section, its rungs and its trials (plain dicts)."""

    session: Session
    sweep: Sweep
    section: SweepConfig
    rungs: list[int]
    trials: list[dict[str, Any]]

    def values_at(self, k: int) -> list[float | None]:
        """Every value recorded at rung ``k``."""
        return [t["rungs"][k]["value"] for t in self.trials if k in t["rungs"]]


def records(s: Sweeping, trial: dict[str, Any], newest: int | None) -> list[tuple[int, int, float | None]]:
    """The rungs ``trial`` passed since its last judged one, as (rung, step, value): a rung counts
    once a verified checkpoint at or past its step exists, and, while the trial trains, its metric
    is logged at or past that checkpoint's step (a value written late is not missed)."""
    found: list[tuple[int, int, float | None]] = []
    if trial["run_id"] is None or newest is None:
        return found
    first = -1 if trial["rung"] is None else trial["rung"]
    logged: int | None = None
    for k in range(first + 1, len(s.rungs)):
        step = checkpoint_at_or_past(s.session, trial["run_id"], s.rungs[k]) if s.rungs[k] <= newest else None
        if step is None:
            break
        if trial["status"] in TRAINING:
            logged = newest_logged(s.session, trial["run_id"], s.section.metric) if logged is None else logged
            if logged is None or logged < step:
                break
        value = value_at(s.session, trial["run_id"], s.section.metric, step, s.section.ranks)
        found.append((k, step, value[1] if value is not None else None))
    return found


def record_rungs(s: Sweeping, trial: dict[str, Any], found: list[tuple[int, int, float | None]]) -> None:
    """Write the rungs ``found`` on the trial (where not written yet) and, for a trial still
    training in a sweep that has not ended, judge it at the newest: stopped early below the cut."""
    session, early = s.session, s.section.early_stop
    rungs = {**trial["rungs"], **{k: {"step": step, "value": value} for k, step, value in found}}
    newest, step, value = found[-1]
    stored = {str(k): [r["step"], r["value"]] for k, r in rungs.items()}
    row = session.execute(update(SweepTrial).where(
        SweepTrial.sweep_id == s.sweep.id, SweepTrial.number == trial["number"],
        or_(SweepTrial.rung.is_(None), SweepTrial.rung < newest)).values(rung=newest, rungs_json=json.dumps(stored)))
    trial["rungs"], trial["rung"] = rungs, newest
    judging = trial["status"] in TRAINING and s.sweep.status in ACTIVE_SWEEPS and early is not None
    if row.rowcount != 1 or not judging:  # type: ignore[attr-defined]  # an UPDATE's CursorResult
        return
    assert early is not None
    judged = asha.judge(value, s.values_at(newest), early.reduction, s.section.goal)
    words = judged.words(value, newest, early.reduction)
    logger.info("sweep %d trial %d: %s = %s at step %d: %s", s.sweep.id, trial["number"], s.section.metric,
                value, step, words)
    if judged.verdict.prunes:
        why = {"rung": newest, "step": step, "value": value, "cut": judged.cut, "metric": s.section.metric}
        trial_row = session.scalar(select(SweepTrial).where(SweepTrial.sweep_id == s.sweep.id,
                                                            SweepTrial.number == trial["number"]))
        if trial_row is not None:
            request_prune(session, trial_row, why, f"sweep {s.sweep.id}")


def record_end(s: Sweeping, trial: dict[str, Any]) -> None:
    """A trial that SUCCEEDED: its objective at its end, written once (no value: NULL, its step
    still written so it is not looked for again)."""
    found = value_at(s.session, trial["run_id"], s.section.metric, float("inf"), s.section.ranks)
    step = found[0] if found is not None else (trial["step"] or 0)
    value = found[1] if found is not None else None
    s.session.execute(update(SweepTrial).where(
        SweepTrial.sweep_id == s.sweep.id, SweepTrial.number == trial["number"],
        SweepTrial.objective_step.is_(None)).values(objective=value, objective_step=step))
    trial.update(objective=value, objective_step=step, value=value, level=len(trial["rungs"]) + 1)
