"""The run state machine: only allowed transitions happen, each leaves a history row, and two
processes racing for the same run cannot both win."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Run, RunStatusHistory
from db.requests import RequestRefused, create_run, request_cancel, request_resume
from db.states import (
    ALLOWED,
    TERMINAL,
    TERMINAL_VALUES,
    AttemptPhase,
    AttemptStatus,
    RunStatus,
    SignalSent,
    StopReason,
    TransitionError,
    attempt_transition,
    transition,
)
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings

pytestmark = pytest.mark.both_dbs


def _queued(sessions: sessionmaker[Session], settings: Settings) -> int:
    with sessions() as s:
        run = create_run(s, RunConfig(name="t"), settings.runs_dir, Price(0.1, "test"))
        s.commit()
        return run.id


def test_status_names_are_the_documented_ones() -> None:
    assert [s.value for s in RunStatus] == [
        "QUEUED", "STARTING", "RUNNING", "RETRYING", "CANCELLING", "PAUSING", "SUCCEEDED", "FAILED", "CANCELLED",
        "PAUSED", "PRUNED",
    ]
    # Only a resume leaves a finished run; a paused one (a sweep's pruned trial too) may also be
    # cancelled for good.
    assert all(ALLOWED[s] == {RunStatus.QUEUED} for s in TERMINAL if s not in (RunStatus.PAUSED, RunStatus.PRUNED))
    assert ALLOWED[RunStatus.PAUSED] == ALLOWED[RunStatus.PRUNED] == {RunStatus.QUEUED, RunStatus.CANCELLED}
    # The finished statuses as a run's row and dict spell them (every page and the CLI compare with these).
    assert TERMINAL_VALUES == {"SUCCEEDED", "FAILED", "CANCELLED", "PAUSED", "PRUNED"} == {str(s) for s in TERMINAL}


def test_happy_path_records_history_with_reasons(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = _queued(sessions, settings)
    with sessions() as s:
        assert transition(s, run_id, RunStatus.STARTING, "launching")
        assert transition(s, run_id, RunStatus.RUNNING, "first step")
        assert transition(s, run_id, RunStatus.SUCCEEDED, "done")
        s.commit()
        run = s.get_one(Run, run_id)
        assert run.status == "SUCCEEDED" and run.started_at and run.ended_at
        history = s.execute(select(RunStatusHistory.from_status, RunStatusHistory.to_status, RunStatusHistory.reason)
                            .where(RunStatusHistory.run_id == run_id).order_by(RunStatusHistory.id)).all()
    assert history == [
        (None, "QUEUED", "submitted"),
        ("QUEUED", "STARTING", "launching"),
        ("STARTING", "RUNNING", "first step"),
        ("RUNNING", "SUCCEEDED", "done"),
    ]


def test_disallowed_transition_changes_nothing(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = _queued(sessions, settings)
    with sessions() as s:
        assert not transition(s, run_id, RunStatus.SUCCEEDED, "skip ahead")
        s.commit()
        assert s.get_one(Run, run_id).status == "QUEUED"
        assert s.scalar(select(RunStatusHistory.id).where(RunStatusHistory.to_status == "SUCCEEDED")) is None


def test_terminal_runs_leave_only_through_a_resume(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = _queued(sessions, settings)
    with sessions() as s:
        assert transition(s, run_id, RunStatus.CANCELLED, "user")
        for target in RunStatus:
            if target is not RunStatus.QUEUED:
                assert not transition(s, run_id, target, "again")
        s.commit()
        assert s.get_one(Run, run_id).status == "CANCELLED" and s.get_one(Run, run_id).ended_at
        assert transition(s, run_id, RunStatus.QUEUED, "resume requested")
        s.commit()
        assert s.get_one(Run, run_id).ended_at is None


def test_racing_sessions_only_one_wins(sessions: sessionmaker[Session], settings: Settings) -> None:
    """Two schedulers (or a scheduler and a cancel) read QUEUED; only the first UPDATE moves it."""
    run_id = _queued(sessions, settings)
    with sessions() as a, sessions() as b:
        assert a.get_one(Run, run_id).status == "QUEUED"
        assert b.get_one(Run, run_id).status == "QUEUED"
        assert transition(a, run_id, RunStatus.STARTING, "scheduler A")
        a.commit()
        assert not transition(b, run_id, RunStatus.STARTING, "scheduler B", expect=RunStatus.QUEUED)
        b.commit()
    with sessions() as s:
        reasons = s.scalars(select(RunStatusHistory.reason).where(RunStatusHistory.to_status == "STARTING")).all()
    assert reasons == ["scheduler A"]


def test_expect_must_be_an_allowed_source(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = _queued(sessions, settings)
    with sessions() as s, pytest.raises(TransitionError):
        transition(s, run_id, RunStatus.RUNNING, "x", expect=RunStatus.QUEUED)


def test_cancel_request_depends_on_status(sessions: sessionmaker[Session], settings: Settings) -> None:
    queued = _queued(sessions, settings)
    running = _queued(sessions, settings)
    with sessions() as s:
        transition(s, running, RunStatus.STARTING, "l")
        transition(s, running, RunStatus.RUNNING, "r")
        s.commit()
        assert "cancel requested" in request_cancel(s, queued)
        assert "cancel requested" in request_cancel(s, running)
        s.commit()
        assert s.get_one(Run, queued).status == "CANCELLED"  # nothing to stop
        assert s.get_one(Run, running).status == "CANCELLING"  # the scheduler stops the processes
        assert "already" in request_cancel(s, queued)


def test_pause_shows_pausing_never_cancelling_and_a_cancel_then_wins(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    """Issue 29 item 4: Pause moves an active run to PAUSING (not CANCELLING); a second Pause says
    it is already being stopped; Resume is refused until it is PAUSED; a Cancel meanwhile turns
    the stop into a cancel (CANCELLING, stop_mode cancel), recorded in the history."""
    run_id = _queued(sessions, settings)
    with sessions() as s:
        transition(s, run_id, RunStatus.STARTING, "l")
        transition(s, run_id, RunStatus.RUNNING, "r")
        assert request_cancel(s, run_id, mode="pause") == f"run {run_id}: pause requested"
        s.commit()
        run = s.get_one(Run, run_id)
        assert (run.status, run.stop_mode) == ("PAUSING", "pause")
        assert "already being stopped (PAUSING)" in request_cancel(s, run_id, mode="pause")
        with pytest.raises(RequestRefused, match=r"being stopped \(PAUSING\); wait until it is PAUSED"):
            request_resume(s, run_id)
        assert "ends CANCELLED instead of PAUSED" in request_cancel(s, run_id)
        s.commit()
        s.refresh(run)
        assert (run.status, run.stop_mode) == ("CANCELLING", "cancel")
        moves = [(h.from_status, h.to_status) for h in s.query(RunStatusHistory).filter_by(run_id=run_id)
                 .order_by(RunStatusHistory.id)]
        assert moves[-2:] == [("RUNNING", "PAUSING"), ("PAUSING", "CANCELLING")]


def test_an_attempt_ends_once_through_attempt_transition(sessions: sessionmaker[Session], settings: Settings) -> None:
    run_id = _queued(sessions, settings)
    with sessions() as s:
        attempt = Attempt(run_id=run_id, number=1, status=AttemptStatus.RUNNING.value, dir="/tmp/a", started_at=1.0)
        s.add(attempt)
        attempt_transition(attempt, AttemptStatus.FAILED, "rank 1 raised", now=5.0)
        assert (attempt.status, attempt.reason, attempt.ended_at) == ("FAILED", "rank 1 raised", 5.0)
        with pytest.raises(TransitionError, match="FAILED -> SUCCEEDED is not allowed"):
            attempt_transition(attempt, AttemptStatus.SUCCEEDED)
        s.commit()


def test_the_attempt_vocabulary_is_the_stored_strings() -> None:
    assert [r.value for r in StopReason] == ["cancel", "pause", "hang", "prune"]
    assert [s.value for s in SignalSent] == ["SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"]
    assert AttemptPhase.FINISHING == "finishing"  # what rank 0 writes, what the watchdog compares
    assert StopReason("pause") is StopReason.PAUSE and StopReason.PAUSE == "pause"
