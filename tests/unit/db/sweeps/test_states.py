"""The sweep state machine: only allowed transitions happen, each leaves a history row, two
processes racing for the same sweep cannot both win, and an ended sweep stays ended."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Sweep, SweepStatusHistory
from db.sweeps.requests import create_sweep
from db.sweeps.states import (
    SWEEP_ALLOWED,
    SWEEP_TERMINAL,
    SweepStatus,
    SweepTransitionError,
    sweep_transition,
)
from db.vocabulary.config import parse_config

pytestmark = pytest.mark.both_dbs

SWEEP = {"name": "lr", "sweep": {"space": {"train.lr": {"log_uniform": [1e-4, 1e-2]}}, "max_trials": 4}}


def _sweep(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        sweep = create_sweep(s, parse_config(SWEEP), [])
        s.commit()
        return sweep.id


def test_status_names_and_the_table() -> None:
    assert [s.value for s in SweepStatus] == ["RUNNING", "PAUSED", "FINISHED", "STOPPED", "CANCELLED"]
    assert {SweepStatus.FINISHED, SweepStatus.STOPPED, SweepStatus.CANCELLED} == SWEEP_TERMINAL
    assert all(SWEEP_ALLOWED[s] == frozenset() for s in SWEEP_TERMINAL)  # an ended sweep stays ended
    assert SWEEP_ALLOWED[SweepStatus.PAUSED] == {SweepStatus.RUNNING, SweepStatus.CANCELLED}


def test_a_sweep_starts_running_and_each_move_is_recorded(sessions: sessionmaker[Session]) -> None:
    sweep_id = _sweep(sessions)
    with sessions() as s:
        assert sweep_transition(s, sweep_id, SweepStatus.PAUSED, "paused by user")
        assert sweep_transition(s, sweep_id, SweepStatus.RUNNING, "resumed by user")
        assert sweep_transition(s, sweep_id, SweepStatus.STOPPED, "the breaker tripped")
        assert not sweep_transition(s, sweep_id, SweepStatus.RUNNING, "again")  # ended: stays ended
        s.commit()
        sweep = s.get(Sweep, sweep_id)
        assert sweep is not None and sweep.status == "STOPPED" and sweep.ended_at is not None
        assert sweep.status_reason == "the breaker tripped"
        assert (sweep.seed, sweep.max_trials, sweep.max_concurrent) == (0, 4, 1)
        history = s.execute(select(SweepStatusHistory.from_status, SweepStatusHistory.to_status)
                            .where(SweepStatusHistory.sweep_id == sweep_id).order_by(SweepStatusHistory.id)).all()
    assert [tuple(h) for h in history] == [(None, "RUNNING"), ("RUNNING", "PAUSED"), ("PAUSED", "RUNNING"),
                                           ("RUNNING", "STOPPED")]


def test_two_racing_moves_cannot_both_win(sessions: sessionmaker[Session]) -> None:
    sweep_id = _sweep(sessions)
    with sessions() as first, sessions() as second:
        assert sweep_transition(first, sweep_id, SweepStatus.FINISHED, "nothing left", expect=SweepStatus.RUNNING)
        first.commit()
        assert not sweep_transition(second, sweep_id, SweepStatus.CANCELLED, "a person", expect=SweepStatus.RUNNING)


def test_a_transition_the_table_refuses_says_so(sessions: sessionmaker[Session]) -> None:
    sweep_id = _sweep(sessions)
    with sessions() as s:
        with pytest.raises(SweepTransitionError, match="FINISHED -> RUNNING"):
            sweep_transition(s, sweep_id, SweepStatus.RUNNING, "x", expect=SweepStatus.FINISHED)
        with pytest.raises(SweepTransitionError, match="sweep 999 does not exist"):
            sweep_transition(s, 999, SweepStatus.PAUSED, "x")
