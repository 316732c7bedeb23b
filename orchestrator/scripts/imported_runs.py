"""Past runs brought into runyard: ``runyard import tensorboard LOGDIR`` makes a finished run of
a TensorBoard log folder's scalars, so a run trained before runyard (or elsewhere) shows in
``runyard ls`` and charts beside the others.

The new run is a ``kind = "script"`` run with one attempt, SUCCEEDED with the reason "imported
from LOGDIR"; its time span is the scalars' own wall times, it costs nothing (runyard did not
run it), and every tag keeps its own steps, each event file's rank as
:func:`orchestrator.scripts.tensorboard_events.rank_of_file` says.
"""

from __future__ import annotations

import time
from itertools import islice
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Event
from db.requests import IMPORTED_TAG, create_run
from db.states import AttemptStatus, RunStatus, attempt_transition, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.layout import RunPaths
from orchestrator import OrchestratorError
from orchestrator.scripts import to_rows
from orchestrator.scripts.metric_collector import write
from orchestrator.scripts.tensorboard_events import find_event_files, import_logdir

# Points written per statement batch: the import holds no more than this in memory.
BATCH = 10_000
# What an imported run is charged: runyard did not run it.
NO_PRICE = Price(usd_per_hour=0.0, unit="imported (not run by runyard)")


class LogdirError(OrchestratorError):
    """A log folder that cannot be imported; the message names the folder and why."""


def import_tensorboard(sessions: sessionmaker[Session], runs_dir: Path, logdir: Path, name: str | None = None) -> int:
    """Make a SUCCEEDED run of every scalar under ``logdir``; returns its id.

    Raises:
        LogdirError: ``logdir`` is not a folder, or holds no event file or no scalar.
    """
    logdir = logdir.expanduser().resolve()
    if not logdir.is_dir():
        raise LogdirError(f"LOGDIR {str(logdir)!r}: no such folder")
    if not find_event_files([logdir], max_entries=10_000_000):
        raise LogdirError(f"LOGDIR {str(logdir)!r}: no TensorBoard event file (events.out.tfevents.*) under it")
    samples = import_logdir(logdir)
    first = list(islice(samples, BATCH))
    if not first:
        raise LogdirError(f"LOGDIR {str(logdir)!r}: its event files hold no scalar")
    ranks = max(s.rank for s in first) + 1
    config = RunConfig.model_validate({
        "name": _name(name or logdir.name),
        "tags": [IMPORTED_TAG],
        "workload": {"kind": "script", "script": str(logdir), "tensorboard_dir": str(logdir)},
        "launch": {"nproc_per_node": ranks},
    })
    reason = f"imported from {logdir}"
    with sessions() as session:
        run = create_run(session, config, runs_dir, NO_PRICE)
        attempt = Attempt(run_id=run.id, number=1, status=AttemptStatus.RUNNING.value,
                          dir=str(RunPaths(Path(run.run_dir)).attempt(1).root), started_at=time.time())
        session.add(attempt)
        session.flush()
        started, ended, last_step = float("inf"), float("-inf"), 0
        batch = first
        while batch:
            started = min(started, min(s.wall_time for s in batch))
            ended = max(ended, max(s.wall_time for s in batch))
            last_step = max(last_step, max(s.step for s in batch))
            ranks = max(ranks, max(s.rank for s in batch) + 1)
            write(session, run.id, 1, to_rows(batch, run.id, 1))
            batch = list(islice(samples, BATCH))
        session.refresh(attempt)
        attempt.started_at, attempt.first_step_at = started, started
        run.max_steps, run.nproc = last_step, ranks
        attempt_transition(attempt, AttemptStatus.SUCCEEDED, reason, now=ended)
        for status in (RunStatus.STARTING, RunStatus.RUNNING):
            transition(session, run.id, status, reason, now=started)
        transition(session, run.id, RunStatus.SUCCEEDED, reason, now=ended)
        session.add(Event(run_id=run.id, attempt=1, at=time.time(), kind="import", message=reason))
        session.commit()
        return run.id


def _name(raw: str) -> str:
    """A run name (letters, digits, ``.``, ``_``, ``-``; starting with a letter or digit) from a folder's name."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in raw).lstrip("._-")[:100]
    return cleaned or "imported"
