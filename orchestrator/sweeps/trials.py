"""A sweep's trials as rows: what the searcher is told of them, and a new trial made.

A trial is created in one transaction with its run: the base config with the trial's values,
checked on the path `runyard submit` takes (orchestrator/submission.py: every check a submit does,
on this machine), priced like any run, QUEUED for the scheduler's admission. A config that path
refuses makes no run: the trial row keeps the refusal (``error``) and the searcher is told it
failed. The row's number is unique in its sweep, so two schedulers (or one started again) cannot
both create trial n: the second's insert fails and its transaction, its run with it, is rolled back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from db.models import Event, Sweep, SweepTrial
from db.queries import price_table
from db.requests import create_run
from db.states import RESUMABLE, RunStatus
from db.sweeps.queries import TRAINING
from db.vocabulary.config import ConfigError
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.submission import run_price, validate
from orchestrator.sweeps.searchers import COMPLETE, FAILED, PRUNED, RUNNING, Told
from orchestrator.sweeps.space import trial_data


def told(trial: Mapping[str, Any], rungs: Sequence[int]) -> Told:
    """What the searcher is told of a trial (a dict of db/sweeps/queries.py's ``trials_of``): its
    objective once it SUCCEEDED, its values at the rungs (by step) when it was stopped early (or
    ended without finishing), RUNNING while it trains or waits, FAILED otherwise."""
    at_rungs = {int(r["step"]): r["value"] for k, r in trial["rungs"].items() if r["value"] is not None}
    status = trial["status"]
    if status == RunStatus.SUCCEEDED.value and trial["objective"] is not None:
        state, value = COMPLETE, trial["objective"]
    elif status in TRAINING or status == RunStatus.PAUSED.value:
        state, value = RUNNING, None
    elif status in {s.value for s in RESUMABLE} or (at_rungs and status == RunStatus.CANCELLED.value):
        state, value = PRUNED, None
    else:
        state, value = FAILED, None
    return Told(trial["number"], dict(trial["params"]), state, value, at_rungs if state == PRUNED else {})


def create_trial(session: Session, sweep: Sweep, number: int, params: dict[str, Any], history: str,
                 settings: Settings, inventory: Inventory) -> SweepTrial:
    """Trial ``number`` of ``sweep`` with ``params``, and its QUEUED run (none when the config is
    refused: the row says why); the caller commits, or rolls back when the number is taken.

    Args:
        history: What the searcher was told when it suggested ``params`` (searchers.history_json).
    """
    now = time.time()
    data = trial_data(json.loads(sweep.base_json), params, sweep.id, sweep.name, number)
    trial = SweepTrial(sweep_id=sweep.id, number=number, params_json=json.dumps(params), history_json=history,
                       rungs_json="{}", promoted=0, created_at=now)
    try:
        config = validate(data, inventory)
    except ConfigError as exc:
        trial.error = "; ".join(exc.problems)
    else:
        run = create_run(session, config, settings.runs_dir, run_price(config, inventory, price_table(session)))
        trial.run_id = run.id
        values = ", ".join(f"{key} = {value!r}" for key, value in params.items())
        session.add(Event(run_id=run.id, at=now, kind="sweep", message=f"trial {number} of sweep {sweep.id}: {values}"))
    session.add(trial)
    session.flush()  # the unique number: a second creator of this trial fails here
    return trial
