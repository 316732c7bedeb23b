"""Cheap reads: what one Runs-page refresh, `runyard ls` and one `runyard logs --follow` poll
cost the database, counted statement by statement on a real SQLite database in tmp_path.

- ``list_runs`` issues the same few statements for 1, 10 and 100 runs, and returns exactly
  what the per-run computation it replaced returns (kept below as ``reference_summary``);
- ``metricstore.recent_many`` equals ``recent`` series by series, across its UNION chunks;
- ``runyard logs --follow`` reads one small statement per poll (the status and the newest
  attempt's number), the attempts again only when a new one begins, and never the run detail.

    pytest tests/unit/test_reads.py
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from bench.bench_runs_list import seed_runs
from db import efficiency, metricstore, queries, run_list, run_summary
from db.models import Attempt, Checkpoint, Run
from db.requests import create_run
from db.states import TERMINAL, RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import ETA_WINDOW, AttemptSpan, Price, cost_usd, eta_estimate, wasted_seconds
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli

pytestmark = pytest.mark.both_dbs

# --- the per-run computation list_runs used to do, one run at a time (3-4 statements a run) ----


def reference_summary(session: Session, run: Run, now: float) -> dict[str, Any]:
    """One run's summary the way db.queries computed it before it was batched."""
    attempts = session.execute(
        select(Attempt).where(Attempt.run_id == run.id).order_by(Attempt.number)
    ).scalars().all()
    status = RunStatus(run.status)
    resume = session.get(Checkpoint, run.resume_checkpoint_id) if run.resume_checkpoint_id is not None else None
    step = run_summary.lineage_step(status, attempts, resume.step if resume else None, run.parent_step)
    if status is RunStatus.SUCCEEDED and run.max_steps and abs(step - run.max_steps) == 1:
        step = run.max_steps
    eta: float | None
    estimate = None
    if status is RunStatus.SUCCEEDED:
        eta = 0.0
    elif status in TERMINAL or status is RunStatus.QUEUED or not attempts or not run.max_steps:
        eta = None
    else:
        key = metricstore.progress_key(session, run.id, attempts[-1].number) or "loss"
        rows = metricstore.recent(session, run.id, key, attempt=attempts[-1].number, rank=0, limit=ETA_WINDOW)
        estimate = eta_estimate([(int(s), float(t)) for s, _, t in rows], run.max_steps)
        eta = estimate.seconds if estimate else None
    cost = cost_usd([(a.started_at, a.ended_at) for a in attempts], run.price_usd_per_hour, now)
    written = dict(session.execute(
        select(Checkpoint.attempt, func.max(Checkpoint.created_at)).where(Checkpoint.run_id == run.id)
        .group_by(Checkpoint.attempt)
    ).all())
    spans = [AttemptSpan(started_at=a.started_at, ended_at=a.ended_at, first_step_at=a.first_step_at,
                         failed=a.cause is not None and a.cause != "PREEMPTED",
                         last_checkpoint_at=written.get(a.number),
                         after_failure=i > 0 and attempts[i - 1].cause is not None)
             for i, a in enumerate(attempts)]
    wasted = wasted_seconds(spans, now) * run.price_usd_per_hour / 3600.0
    projected = cost + (eta or 0.0) * run.price_usd_per_hour / 3600.0 if status not in TERMINAL else cost
    return {
        "id": run.id, "name": run.name, "status": run.status, "status_reason": run.status_reason,
        "tags": json.loads(run.tags_json or "[]"), "step": step, "max_steps": run.max_steps,
        "progress": min(1.0, step / run.max_steps) if run.max_steps else 0.0, "nproc": run.nproc,
        "executor": run.executor, "job_id": attempts[-1].job_id if attempts else None,
        "job_state": attempts[-1].job_state if attempts else None,
        "created_at": run.created_at, "started_at": run.started_at, "ended_at": run.ended_at,
        "elapsed_s": run_summary.elapsed_s(run, attempts, now),
        "attempt_count": len(attempts), "cost_usd": round(cost, 6), "cost_wasted_usd": round(wasted, 6),
        "cost_projected_usd": round(projected, 6), "price_usd_per_hour": run.price_usd_per_hour,
        "price_unit": run.price_unit, "eta_s": eta,
        "eta_range_s": (estimate.low, estimate.high) if estimate else None, "parent_run_id": run.parent_run_id,
        "parent_step": run.parent_step, "resume_checkpoint_id": run.resume_checkpoint_id,
        "retries_used": run.retries_used, "retry_at": run.retry_at, "starred": run.starred,
        "archived": run.archived, "note": run.note,
    }


# --- counting statements ------------------------------------------------------------------------


@pytest.fixture
def statements() -> Iterator[list[tuple[Engine, str]]]:
    """Every statement any engine sends while the test runs, with the engine that sent it (the
    CLI builds its own engine, so the listener is on the Engine class)."""
    sent: list[tuple[Engine, str]] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        sent.append((conn.engine, statement))

    event.listen(Engine, "before_cursor_execute", record)
    yield sent
    event.remove(Engine, "before_cursor_execute", record)


def counted(sessions: sessionmaker[Session], statements: list[tuple[Engine, str]],
            read: Callable[[Session], Any]) -> tuple[Any, list[str]]:
    """``read`` in a new session, and the statements it sent."""
    with sessions() as s:
        start = len(statements)
        result = read(s)
        return result, [sql for _, sql in statements[start:]]


# --- list_runs ------------------------------------------------------------------------------------


def test_list_runs_sends_the_same_statements_for_1_10_and_100_runs(
        settings: Settings, sessions: sessionmaker[Session], statements: list[tuple[Engine, str]]) -> None:
    per_size = {}
    for total in (1, 10, 100):
        with sessions() as s:
            seed_runs(s, settings.runs_dir, total - sum(1 for _ in s.scalars(select(Run.id))))
            s.commit()
        runs, sent = counted(sessions, statements, run_list.list_runs)
        assert len(runs) == total
        per_size[total] = sent
    # runs; their attempts; their checkpoint times; the name id of "loss"; the live runs' newest points;
    # from 10 runs on, a live run (retrying) has no loss points: the metrics it has, in one more.
    assert [len(sent) for sent in per_size.values()] == [5, 6, 6]
    assert all(sum("FROM metric_points" in sql for sql in sent) == 1 for sent in per_size.values())


def test_list_runs_equals_the_per_run_computation(settings: Settings, sessions: sessionmaker[Session]) -> None:
    now = time.time()
    with sessions() as s:
        seed_runs(s, settings.runs_dir, 40, now=now - 5)
        s.commit()
    with sessions() as s:
        got = run_list.list_runs(s, now=now)
        runs = s.scalars(select(Run).order_by(Run.id.desc())).all()
        expected = [reference_summary(s, r, now) for r in runs]
        running = run_list.list_runs(s, ["RUNNING", "RETRYING"], limit=7, now=now)
    assert len(got) == 40 and got == expected  # every field of every run, floats bit for bit
    assert running == [e for e in expected if e["status"] in ("RUNNING", "RETRYING")][:7]
    # The seeded mix reaches every branch: ETAs from points, none without points, 0 at success;
    # money wasted by failures; runs without attempts.
    etas = [e["eta_s"] for e in expected]
    assert any(eta not in (None, 0.0) for eta in etas) and None in etas and 0.0 in etas
    assert any(e["cost_wasted_usd"] > 0 for e in expected) and any(e["attempt_count"] == 0 for e in expected)
    assert any(e["attempt_count"] == 2 for e in expected)


def test_run_detail_summary_is_the_per_run_computation(settings: Settings, sessions: sessionmaker[Session],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    with sessions() as s:
        ids = seed_runs(s, settings.runs_dir, 6, now=now - 5)
        s.commit()
    monkeypatch.setattr(queries.time, "time", lambda: now)
    with sessions() as s:
        for run_id in ids:
            detail = queries.run_detail(s, run_id)
            run = s.get(Run, run_id)
            assert run is not None
            expected = reference_summary(s, run, now)
            assert {k: detail[k] for k in expected} == expected


def test_recent_many_equals_recent_for_each_series(settings: Settings, sessions: sessionmaker[Session],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with sessions() as s:
        seed_runs(s, settings.runs_dir, 12)
        s.commit()
    with sessions() as s:
        series = [(a.run_id, a.number, rank) for a in s.scalars(select(Attempt)) for rank in (0, 1, 5)]
        series.append((999, 1, 0))  # no such run: no points
        expected = {k: metricstore.recent(s, k[0], "loss", attempt=k[1], rank=k[2], limit=3) for k in series}
        assert metricstore.recent_many(s, "loss", series, limit=3) == expected
        assert metricstore.recent_many(s, "no-such-metric", series[:2], limit=3) == {k: [] for k in series[:2]}
        assert metricstore.recent_many(s, "loss", [], limit=3) == {}
        monkeypatch.setattr("db.metricstore.points._UNION_PARTS", 4)  # several UNION statements, same answer
        assert metricstore.recent_many(s, "loss", series, limit=3) == expected
    assert any(len(points) == 3 for points in expected.values())  # the limit mattered


def test_the_eta_of_a_run_without_loss_comes_from_the_metric_it_reports(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """A script that calls its metrics train/loss (every step) and val/loss (every 50): the Runs
    list and the Run page project from train/loss, the metric that got furthest and most often."""
    now = time.time()
    with sessions() as s:
        run = create_run(s, RunConfig.model_validate({"name": "hf", "train": {"max_steps": 1000}}),
                         settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        for status in ("STARTING", "RUNNING"):
            transition(s, run.id, RunStatus(status), "t")
        s.add(Attempt(run_id=run.id, number=1, status="RUNNING", dir="/tmp/a", started_at=now - 300,
                      first_step_at=now - 290, progress_at=now, last_step=200))
        points = [{"run_id": run.id, "attempt": 1, "rank": 0, "step": step, "key": "train/loss", "value": 1.0,
                   "wall_time": now - 200 + step * 0.5} for step in range(1, 201)]
        points += [{"run_id": run.id, "attempt": 1, "rank": 0, "step": step, "key": "val/loss", "value": 2.0,
                    "wall_time": now - 200 + step * 0.5} for step in range(50, 201, 50)]
        metricstore.write_points(s.connection(), points)
        s.commit()
        assert metricstore.progress_key(s, run.id, 1) == "train/loss"
        listed = next(r for r in run_list.list_runs(s) if r["id"] == run.id)
        detail = queries.run_detail(s, run.id)
    # 800 steps to go at 0.5 s a step.
    assert listed["eta_s"] == detail["eta_s"] == pytest.approx(400, rel=0.05)


@pytest.mark.parametrize(("last_step", "shown"), [(2999, 3000), (3001, 3000), (3000, 3000), (2990, 2990)])
def test_a_succeeded_run_one_step_off_its_total_shows_complete(
        settings: Settings, sessions: sessionmaker[Session], last_step: int, shown: int) -> None:
    """Lightning's last logged step is 2999 of 3000 (steps from 0); nanoGPT runs to 1500
    inclusive (1501 of 1500): done is done. A script that stopped early stays as it stopped."""
    with sessions() as s:
        run = create_run(s, RunConfig.model_validate({"name": "pl", "train": {"max_steps": 3000}}),
                         settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        for to in ("STARTING", "RUNNING", "SUCCEEDED"):
            transition(s, run.id, RunStatus(to), "t")
        s.add(Attempt(run_id=run.id, number=1, status="SUCCEEDED", dir="/tmp/a", started_at=1.0, ended_at=2.0,
                      last_step=last_step))
        s.commit()
        detail = queries.run_detail(s, run.id)
    assert detail["step"] == shown and detail["attempts"][0]["last_step"] == last_step


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


def test_goodput_parts_say_where_the_time_went(sessions: sessionmaker[Session], settings: Settings) -> None:
    """Two attempts: the first spent 20 s starting, its rank failed 58 s into training with half
    its work lost (torchrun exited 2 s later), then a 20 s wait; the second started in 10 s. Saves
    blocked 3 s. The failure's part is the recovery's phases (failure to the next first step,
    the second attempt's start-up included) plus the lost work."""
    with sessions() as s:
        run = create_run(s, RunConfig(), settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.add(Checkpoint(run_id=run.id, attempt=1, step=50, path="/c/step-50", bytes=1, sha256="0",
                         params_digest="0", blocked_s=3.0, total_s=4.0, created_at=130.0))
        s.flush()
        attempts = [
            {"number": 1, "started_at": 100.0, "first_step_at": 120.0, "ended_at": 180.0, "failed_at": 178.0,
             "cause": "USER_ERROR", "last_step": 100, "resume_step": None, "steps_lost": 50},
            {"number": 2, "started_at": 200.0, "first_step_at": 210.0, "ended_at": 300.0, "failed_at": None,
             "cause": None, "last_step": 300, "resume_step": 50, "steps_lost": None},
        ]
        parts = efficiency.goodput_parts(s, run, attempts, now=300.0)
    wall = 80 + 20 + 100  # the attempts, and the wait before the retry
    assert parts["startup"] == pytest.approx(20 / wall)  # the first attempt's; the second's is the recovery's
    assert parts["checkpoints"] == pytest.approx(3 / wall)
    assert parts["failures"] == pytest.approx((210 - 178 + 29) / wall)  # the recovery, and half of 58 s redone
    assert parts["other"] == pytest.approx(1 - (20 + 3 + 61) / wall)  # no step times stored: nothing productive
