"""The scheduler-to-rank environment (trainer/context.py)."""

from __future__ import annotations

from pathlib import Path

from trainer.context import RunContext, context_from_env


def test_the_ranks_get_the_resume_path_and_its_step() -> None:
    env = RunContext(run_id=1, attempt=2, db_url="sqlite://", run_dir=Path("/r"), attempt_dir=Path("/r/a/2"),
                     resume_step=200, resume_path=Path("/w/out/ckpt.pt")).to_env()
    assert (env["RUNYARD_RESUME_PATH"], env["RUNYARD_RESUME_STEP"]) == ("/w/out/ckpt.pt", "200")
    assert "RUNYARD_RESUME_DIR" not in env
    back = context_from_env(env)
    assert (back.resume_path, back.resume_step, back.resume_dir) == (Path("/w/out/ckpt.pt"), 200, None)
