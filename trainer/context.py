"""What the scheduler passes to the ranks, through environment variables. The scheduler builds the
environment with :meth:`RunContext.to_env`; every rank reads it back with :func:`context_from_env`,
through :class:`db.vocabulary.settings.RankEnv`, the variables' typed and documented list. This module must
not import torch (the scheduler imports it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from db.vocabulary.layout import AttemptPaths, RunPaths


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
    # A file the script saved itself (workload.checkpoint_glob, or adopted through the SDK) that
    # this attempt starts from; resume_step is then the step runyard recorded for it.
    resume_path: Path | None = None

    @property
    def checkpoint_dir(self) -> Path:
        return RunPaths(self.run_dir).checkpoints

    @property
    def config_file(self) -> Path:
        """The config this attempt runs with: the one the scheduler wrote to the attempt's folder
        (the run's plus the attempt's overrides, such as half the micro-batch after an OOM)."""
        return AttemptPaths(self.attempt_dir).config

    @property
    def managed(self) -> bool:
        return self.run_id is not None and self.db_url is not None

    def to_env(self) -> dict[str, str]:
        """The environment variables that carry this context to every process of an attempt
        (:func:`context_from_env` reads them back; the sweeper finds an attempt's processes by
        ``RUNYARD_RUN_DIR`` and ``RUNYARD_ATTEMPT``)."""
        env = {
            "RUNYARD_ATTEMPT": str(self.attempt),
            "RUNYARD_RUN_DIR": str(self.run_dir),
            "RUNYARD_ATTEMPT_DIR": str(self.attempt_dir),
        }
        if self.run_id is not None:
            env["RUNYARD_RUN_ID"] = str(self.run_id)
        if self.db_url is not None:
            env["RUNYARD_DB_URL"] = self.db_url
        if self.resume_dir is not None and self.resume_step is not None:
            env["RUNYARD_RESUME_DIR"] = str(self.resume_dir)
            env["RUNYARD_RESUME_STEP"] = str(self.resume_step)
        if self.resume_path is not None:
            env["RUNYARD_RESUME_PATH"] = str(self.resume_path)
            if self.resume_step is not None:
                env["RUNYARD_RESUME_STEP"] = str(self.resume_step)
        return env


def context_from_env(environ: Mapping[str, str] | None = None) -> RunContext:
    """The context the scheduler passed in ``environ`` (default ``os.environ``), read through
    :class:`db.vocabulary.settings.RankEnv` (a bad value stops the rank with a sentence naming it).

    Raises:
        db.vocabulary.settings.SettingsError: a ``RUNYARD_*`` variable of the protocol holds a value of the wrong kind.
    """
    from db.vocabulary.settings import RankEnv  # noqa: PLC0415 - pydantic-settings: only a process that reads its context pays for it

    env = RankEnv.from_env(environ)
    run_dir = env.run_dir or Path(".")
    return RunContext(
        run_id=env.run_id,
        attempt=env.attempt,
        db_url=env.db_url,
        run_dir=run_dir,
        attempt_dir=env.attempt_dir or run_dir,
        resume_dir=env.resume_dir,
        resume_step=env.resume_step,
        resume_path=env.resume_path,
    )
