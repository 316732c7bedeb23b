"""A run's checkpoint records (trainer/checkpoint/history.py)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Event
from db.vocabulary.config import parse_config
from db.vocabulary.settings import Settings
from tests.unit.orchestrator.scripts.script_checkpoints import add_attempt, script_run, workdir
from trainer.checkpoint.history import CheckpointHistory
from trainer.checkpoint.manager import CheckpointManager
from trainer.checkpoint.writing import SaveResult

__all__ = ["workdir"]  # the fixtures, from the helper module


def test_keep_best_by_a_metric_no_checkpoint_carries_is_said_with_the_names_seen(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir)
    root = tmp = workdir / "ckpts"
    config = parse_config({"checkpoint": {"keep_last": 1, "keep_best": 1, "best_metric": "eval_loss"}}).checkpoint
    history = CheckpointHistory(run_id, 1, config, CheckpointManager(root, async_save=False))
    with sessions() as s:
        add_attempt(s, run_id, 1, last_step=300)
        for step in (100, 200, 300):
            history.record(s.connection(), [SaveResult(step, tmp / f"step-{step}", 1, "0", "0", 0.0, 0.0,
                                                       {"val_loss": 1.0 / step, "train_loss": 2.0})])
        s.commit()
        said = list(s.scalars(select(Event.message).where(Event.run_id == run_id, Event.kind == "checkpoint")))
    assert said == ["checkpoint.keep_best = 1 keeps nothing by checkpoint.best_metric = 'eval_loss': no checkpoint "
                    "carries it; the metrics the checkpoints carry: 'train_loss', 'val_loss' (set "
                    "checkpoint.best_metric to one of them)"]
