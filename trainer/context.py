"""What the scheduler passes to the ranks, through environment variables."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class RunContext:
    """Where this process belongs: run, attempt, database and folders.

    Outside runyard (a plain ``torchrun`` launch) ``run_id`` is None and nothing is reported.
    """

    run_id: int | None
    attempt: int
    db_url: str | None
    run_dir: Path
    attempt_dir: Path
    resume_dir: Path | None = None
    resume_step: int | None = None
    overrides: dict = field(default_factory=dict)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def managed(self) -> bool:
        return self.run_id is not None and self.db_url is not None


def context_from_env(environ: dict[str, str] | None = None) -> RunContext:
    env = os.environ if environ is None else environ
    run_dir = Path(env.get("RUNYARD_RUN_DIR") or ".")
    run_id = env.get("RUNYARD_RUN_ID")
    return RunContext(
        run_id=int(run_id) if run_id else None,
        attempt=int(env.get("RUNYARD_ATTEMPT") or 1),
        db_url=env.get("RUNYARD_DB_URL"),
        run_dir=run_dir,
        attempt_dir=Path(env.get("RUNYARD_ATTEMPT_DIR") or run_dir),
        resume_dir=Path(env["RUNYARD_RESUME_DIR"]) if env.get("RUNYARD_RESUME_DIR") else None,
        resume_step=int(env["RUNYARD_RESUME_STEP"]) if env.get("RUNYARD_RESUME_STEP") else None,
        overrides=json.loads(env.get("RUNYARD_CONFIG_OVERRIDES") or "{}"),
    )
