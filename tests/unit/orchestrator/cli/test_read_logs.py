"""`runyard logs --follow` (orchestrator/cli/read.py) on SQLite and PostgreSQL: one poll reads one
small statement (the status and the newest attempt's number), the attempts again only when a new
one begins, and never the run detail."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from db import queries
from db.models import Attempt
from db.requests import create_run
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from tests.unit.db.statements import statements

__all__ = ["statements"]  # the fixtures, from the helper module


pytestmark = pytest.mark.both_dbs


# --- runyard logs --follow ---------------------------------------------------------------------


def write_rank_log(attempt_dir: Path, rank: int, text: str) -> None:
    """Append to a rank's stdout.log where torchrun puts it, and to the launcher's log."""
    log = attempt_dir / "ranks" / "rdzv_x" / "attempt_0" / str(rank) / "stdout.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(text)


def test_logs_follow_reads_only_the_status_each_poll(
        settings: Settings, sessions: sessionmaker[Session], statements: list[tuple[Engine, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that goes on while it is followed: a new line, then a second attempt, then success.
    Each poll reads the status and the newest attempt number in one statement, and the attempts
    again only when the second one begins; the run detail is never read."""
    with sessions() as s:
        run = create_run(s, RunConfig(name="followed"), settings.runs_dir, Price(1.0, "x"))
        s.flush()
        for status in (RunStatus.STARTING, RunStatus.RUNNING):
            assert transition(s, run.id, status, "test")
        run_id, run_dir = run.id, Path(run.run_dir)
        s.add(Attempt(run_id=run_id, number=1, status="RUNNING", dir=str(run_dir / "attempts" / "1"),
                      started_at=time.time()))
        s.commit()
    write_rank_log(run_dir / "attempts" / "1", 0, "step 1\n")

    def what_happens_next(poll: int) -> None:
        with sessions() as s:
            if poll == 1:
                write_rank_log(run_dir / "attempts" / "1", 0, "step 2\n")
            elif poll == 2:
                s.add(Attempt(run_id=run_id, number=2, status="RUNNING", dir=str(run_dir / "attempts" / "2"),
                              started_at=time.time()))
                write_rank_log(run_dir / "attempts" / "2", 1, "resumed\n")
            elif poll == 4:
                write_rank_log(run_dir / "attempts" / "2", 1, "done\n")
                assert transition(s, run_id, RunStatus.SUCCEEDED, "test")
            s.commit()

    mine = sessions.kw["bind"]
    polls: list[int] = []  # where each sleep fell in the CLI's statements

    def sleep(seconds: float) -> None:
        polls.append(sum(1 for engine, _ in statements if engine is not mine))
        what_happens_next(len(polls))

    def no_detail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("runyard logs --follow read the whole run detail")

    monkeypatch.setattr("orchestrator.cli.read.time.sleep", sleep)
    monkeypatch.setattr(queries, "run_detail", no_detail)
    result = CliRunner().invoke(cli, ["logs", str(run_id), "--follow"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[rank 0] step 1", "[rank 0] step 2", "[rank 1] resumed", "[rank 1] done"]

    cli_sent = [sql for engine, sql in statements if engine is not mine]
    bounds = [*polls, len(cli_sent)]
    per_poll = [cli_sent[a:b] for a, b in itertools.pairwise(bounds)]
    # After each sleep: one statement; three when the second attempt appeared (the status, then
    # the run's config and its attempts' folders); two after the last (the poll that saw
    # SUCCEEDED, then the final read of what the ranks wrote last).
    assert [len(sent) for sent in per_poll] == [1, 3, 1, 2]
    for sql in (sql for sent in per_poll for sql in sent):
        assert "FROM runs" in sql or "FROM attempts" in sql, sql
        for table in ("checkpoints", "metric_", "events", "run_status_history"):
            assert table not in sql, sql
