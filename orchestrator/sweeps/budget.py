"""What a sweep may still spend, and its breaker: decisions over plain values.

The budget (``[sweep.budget]``): device-hours, dollars and wall time, each 0 for no limit, against
what the sweep has spent (db/sweeps/queries.py's ``spent``). Once one is reached nothing new starts
or is promoted, and the trials still training stop gracefully at once: each finishes its step,
checkpoints and ends PRUNED, so the sweep overspends by at most one step and a save, and a person
can still promote one (`runyard sweep promote`).

The breaker: trials that failed with the same error, ``max_failed`` of them, stop the sweep and
say which error. "The same" is the retry policy's repeated-error signature (the exception line,
volatile parts aside: db/vocabulary/causes.py); a trial whose config was refused counts by its
refusal. A script that crashes for every setting must not burn the night.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Attempt
from db.states import RunStatus
from db.sweeps.queries import REFUSED
from db.sweeps.states import BREAKER_WORDS, BUDGET_WORDS
from db.vocabulary.causes import Cause, normalize_exception
from db.vocabulary.config.sweep import BudgetConfig

# (key of [sweep.budget], what it counts), in the order a sentence names them.
LIMITS = (("gpu_hours", "GPU-hours"), ("usd", "USD"), ("wall_hours", "hours of wall time"))


def limit_reached(spent: Mapping[str, float], budget: BudgetConfig) -> str | None:
    """The first limit of ``budget`` that ``spent`` has reached, as a sentence; None while none is."""
    for key, unit in LIMITS:
        limit = float(getattr(budget, key))
        if limit and spent[key] >= limit:
            return f"{BUDGET_WORDS}: {spent[key]:.4g} of sweep.budget.{key} = {limit:g} {unit} spent"
    return None


def tripped(failures: Sequence[str], max_failed: int) -> str | None:
    """The breaker's sentence when ``max_failed`` of ``failures`` (one signature a failed trial)
    are the same error; None while none is (or ``max_failed`` is 0: no breaker)."""
    if not max_failed or not failures:
        return None
    signature, count = Counter(failures).most_common(1)[0]
    if count < max_failed:
        return None
    return (f"{count} trials failed with the same error ({signature}): {BREAKER_WORDS} "
            f"(sweep.budget.max_failed = {max_failed}); fix it, then start a new sweep")


def failures(session: Session, trials: Sequence[Mapping[str, Any]]) -> list[str]:
    """The breaker's evidence: for each trial failed by a user error (an exception in the training
    code: ``Cause.USER_ERROR``), its signature (its run's last attempt's exception, volatile parts
    aside), and for each trial refused, its refusal."""
    failed = [t["run_id"] for t in trials if t["status"] == RunStatus.FAILED.value and t["run_id"] is not None]
    found = [f"config refused: {t['error']}" for t in trials if t["status"] == REFUSED]
    if not failed:
        return found
    last: dict[int, tuple[int, str | None, str | None]] = {}
    for run_id, number, cause, exception in session.execute(
            select(Attempt.run_id, Attempt.number, Attempt.cause, Attempt.exception)
            .where(Attempt.run_id.in_(failed))):
        if run_id not in last or number > last[run_id][0]:
            last[run_id] = (number, cause, exception)
    # A user error only: the machine's failures (a lost node, an OOM kill) are the retry policy's.
    found += [normalize_exception(exception) or "an exception without a message"
              for _number, cause, exception in last.values() if cause == Cause.USER_ERROR.value]
    return found
