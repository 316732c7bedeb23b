"""The budget and the breaker over plain values: which limit is reached first, with its sentence;
how many failures of the same error trip the breaker (volatile parts of the error aside)."""

from __future__ import annotations

import pytest

from db.sweeps.states import stopped_by
from db.vocabulary.causes import normalize_exception
from db.vocabulary.config.sweep import BudgetConfig
from orchestrator.sweeps.budget import limit_reached, tripped

SPENT = {"gpu_hours": 2.0, "usd": 5.0, "wall_hours": 1.5}


@pytest.mark.parametrize(("budget", "expected"), [
    ({}, None),  # no limit
    ({"gpu_hours": 3.0, "usd": 10.0, "wall_hours": 2.0}, None),
    ({"gpu_hours": 2.0}, "its budget is reached: 2 of sweep.budget.gpu_hours = 2 GPU-hours spent"),
    ({"usd": 4.5}, "its budget is reached: 5 of sweep.budget.usd = 4.5 USD spent"),
    ({"wall_hours": 1.25}, "its budget is reached: 1.5 of sweep.budget.wall_hours = 1.25 hours of wall time spent"),
    ({"usd": 1.0, "wall_hours": 1.0}, "its budget is reached: 5 of sweep.budget.usd = 1 USD spent"),  # the first named
])
def test_the_first_limit_reached(budget: dict[str, float], expected: str | None) -> None:
    assert limit_reached(SPENT, BudgetConfig.model_validate(budget)) == expected


A = normalize_exception("RuntimeError: bad value at 0x7f00aa12 (at train.py:9 in step)") or ""
B = normalize_exception("RuntimeError: bad value at 0x7f11bb34 (at train.py:9 in step)") or ""
C = "ValueError: nan loss (at train.py:20 in main)"


@pytest.mark.parametrize(("failures", "max_failed", "trips"), [
    ([], 3, False),
    ([A, C], 2, False),  # two errors, one each
    ([A, B], 2, True),  # the same error: its address aside
    ([A, B, C], 3, False),
    ([A, B, A], 3, True),
    ([A, A, A, A], 0, False),  # 0: no breaker
])
def test_the_breaker(failures: list[str], max_failed: int, trips: bool) -> None:
    sentence = tripped(failures, max_failed)
    assert (sentence is not None) is trips
    if sentence is not None:
        assert sentence.startswith(f"{failures.count(A)} trials failed with the same error (RuntimeError: bad value "
                                   "at 0x*")
        assert sentence.endswith(f"(sweep.budget.max_failed = {max_failed}); fix it, then start a new sweep")


def test_a_stopped_sweeps_reason_says_which_stopped_it() -> None:
    # The alerts tell sweep_breaker from sweep_budget by these words (db/sweeps/states.py).
    breaker = tripped([A, B], 2)
    budget = limit_reached(SPENT, BudgetConfig(usd=4.5))
    assert stopped_by(f"stopped: {breaker}") == "breaker"
    assert stopped_by(f"stopped: {budget}") == "budget"
    # An error whose own words are the budget's still trips the breaker.
    assert stopped_by(f"stopped: {tripped(['ValueError: its budget is reached'] * 2, 2)}") == "breaker"
    assert stopped_by("cancelled by a person") is None and stopped_by(None) is None
