"""Runs as the workspace tests want them: submitted with a name, tags and a learning rate and
walked to their end, their losses, and the names a list shows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from db.metricstore import write_points
from db.models import Attempt
from db.requests import create_run
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings


def workspace_run(s: Session, settings: Settings, name: str, *, tags: tuple[str, ...] = (), lr: float = 0.001,
                  ends: RunStatus | None = RunStatus.SUCCEEDED) -> int:
    """A run named ``name`` with ``tags`` and ``lr``, walked to ``ends`` (None: left QUEUED); its id."""
    config = RunConfig.model_validate({"name": name, "tags": list(tags), "train": {"lr": lr, "max_steps": 100}})
    run = create_run(s, config, settings.runs_dir, Price(1.0, "cpu-hour"))
    s.flush()
    path = {None: [], RunStatus.RUNNING: [RunStatus.STARTING, RunStatus.RUNNING],
            RunStatus.SUCCEEDED: [RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED]}[ends]
    for status in path:
        assert transition(s, run.id, status, "test")
    return run.id


def add_losses(s: Session, run_id: int, values: list[float], key: str = "loss") -> None:
    """Attempt 1 of ``run_id``, which logged ``values`` of ``key`` at steps 1, 2, ... on rank 0."""
    s.add(Attempt(run_id=run_id, number=1, status="SUCCEEDED", dir="/nowhere", started_at=1.0, last_step=len(values)))
    s.flush()
    write_points(s.connection(), [{"run_id": run_id, "attempt": 1, "rank": 0, "step": i + 1, "key": key,
                                   "value": v, "wall_time": 1.0 + i} for i, v in enumerate(values)])


def names_of(runs: list[dict[str, Any]]) -> list[str]:
    """The names of ``runs``, in their order."""
    return [r["name"] for r in runs]
