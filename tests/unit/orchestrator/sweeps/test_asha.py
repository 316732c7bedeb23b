"""ASHA's arithmetic over plain values: the rungs a sweep's settings give, the cut at a rung and
the verdict on a trial there, and which stopped trial a rung promotes."""

from __future__ import annotations

import math

import pytest

from db.vocabulary.config import parse_config
from db.vocabulary.config.sweep import EarlyStopConfig
from orchestrator.sweeps import asha
from orchestrator.sweeps.asha import Verdict

NAN = math.nan


@pytest.mark.parametrize(("min_steps", "reduction", "max_steps", "every", "expected"), [
    (10, 3, 300, 10, [10, 30, 90, 270]),
    (10, 3, 270, 10, [10, 30, 90]),  # the last step is the end, not a rung
    (7, 2, 100, 10, [10, 20, 30, 60]),  # each rounded up to a checkpoint: 7, 14, 28, 56
    (5, 2, 100, 25, [25, 50]),  # 5, 10 and 20 all round to 25: one rung
    (10, 3, 10, 10, []),  # no rung below the end
    (40, 2, 100, 30, [60, 90]),  # 40 rounds up to 60, 80 to 90; 160 is past the end
    (3, 4, 100, 0, [3, 12, 48]),  # a script: its own cadence, the nominal steps
])
def test_the_rungs(min_steps: int, reduction: int, max_steps: int, every: int, expected: list[int]) -> None:
    assert asha.rungs(EarlyStopConfig(min_steps=min_steps, reduction=reduction), max_steps, every) == expected


@pytest.mark.parametrize(("overrides", "problem"), [
    ({"train": {"max_steps": 100}, "checkpoint": {"every_steps": 0}},
     "sweep.early_stop needs checkpoint.every_steps > 0"),
    ({"train": {"max_steps": 100}, "checkpoint": {"every_steps": 100}},
     "sweep.early_stop.min_steps = 10 rounded up to checkpoint.every_steps = 100 gives no rung below "
     "train.max_steps = 100"),
    ({"workload": {"kind": "script", "script": "x.py"}}, "sweep.early_stop needs workload.max_steps"),
    ({"workload": {"kind": "script", "script": "x.py", "max_steps": 8}},
     "sweep.early_stop.min_steps = 10 gives no rung below workload.max_steps = 8"),
    ({"train": {"max_steps": 100}, "checkpoint": {"every_steps": 20}}, None),
])
def test_settings_that_give_no_rung_are_refused_naming_the_keys(overrides: dict, problem: str | None) -> None:
    base = parse_config(overrides)
    problems = asha.rung_problems(base, EarlyStopConfig(min_steps=10, reduction=3))
    assert len(problems) == (problem is not None)
    assert problem is None or problems[0].startswith(problem)


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([1.0, 2.0, 3.0], 2 / 3, 2.0 + 1 / 3),
    ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
    ([5.0], 0.9, 5.0),
    ([-math.inf, -math.inf, -1.0], 2 / 3, -1.0),  # between no value and a value: the value
])
def test_the_quantile_interpolates_as_numpy_does(values: list[float], q: float, expected: float) -> None:
    assert asha.quantile(values, q) == pytest.approx(expected)


# (value, the rung's values with it, reduction, goal) -> verdict, cut on the metric's scale
JUDGED = [
    ("alone: fewer than reduction values", 0.9, [0.9], 3, "minimize", Verdict.FEW, None),
    ("two of three needed", 0.9, [0.1, 0.9], 3, "minimize", Verdict.FEW, None),
    ("the best of three passes", 0.1, [0.5, 0.9, 0.1], 3, "minimize", Verdict.CONTINUES, 0.5 - 0.4 / 3),
    ("the middle of three stops", 0.5, [0.5, 0.9, 0.1], 3, "minimize", Verdict.PRUNED, 0.5 - 0.4 / 3),
    ("maximize turns it round", 0.9, [0.5, 0.9, 0.1], 3, "maximize", Verdict.CONTINUES, 0.5 + 0.4 / 3),
    ("half of two with reduction 2", 0.4, [0.5, 0.4], 2, "minimize", Verdict.CONTINUES, 0.45),
    ("the worse of two stops", 0.6, [0.5, 0.6], 2, "minimize", Verdict.PRUNED, 0.55),
    ("equal to the cut continues", 0.5, [0.5, 0.5, 0.5], 3, "minimize", Verdict.CONTINUES, 0.5),
    ("no value stops", None, [0.5, 0.6, None], 3, "minimize", Verdict.PRUNED, 0.6 - 0.1 / 3),
    ("NaN stops", NAN, [0.5, 0.6, NAN], 3, "maximize", Verdict.PRUNED, 0.5 + 0.1 / 3),
    ("a value beside mostly missing ones passes", 0.7, [None, None, 0.7], 3, "minimize", Verdict.CONTINUES, 0.7),
]


@pytest.mark.parametrize(("name", "value", "values", "reduction", "goal", "verdict", "cut"), JUDGED,
                         ids=[j[0] for j in JUDGED])
def test_a_trial_at_a_rung(name: str, value: float | None, values: list[float | None], reduction: int, goal: str,
                           verdict: Verdict, cut: float | None) -> None:
    judged = asha.judge(value, values, reduction, goal)
    assert judged.verdict is verdict
    assert judged.cut == (None if cut is None else pytest.approx(cut))
    assert judged.verdict.prunes == (verdict is Verdict.PRUNED)


def test_the_verdicts_sentence_says_the_value_and_the_cut() -> None:
    judged = asha.judge(0.6, [0.5, 0.6], 2, "minimize")
    assert judged.words(0.6, 0, 2) == "0.6 is not as good as the cut 0.55 at rung 0: it is stopped early"
    assert asha.judge(0.6, [0.6], 2, "minimize").words(0.6, 1, 2) == "fewer than 2 values at rung 1: it continues"


PROMOTIONS = [
    ("among the best 2 of 4", 0.6, [0.5, 0.6, 0.9, 0.95], 2, "minimize", True),
    ("third of 4 with reduction 2", 0.9, [0.5, 0.6, 0.9, 0.95], 2, "minimize", False),
    ("3 values keep 1", 0.6, [0.5, 0.6, 0.9], 3, "minimize", False),
    ("the best of 3 is kept", 0.5, [0.5, 0.6, 0.9], 3, "minimize", True),
    ("fewer than reduction keep none", 0.1, [0.1, 0.9], 3, "minimize", False),
    ("a tie with the last kept is kept", 0.6, [0.6, 0.6, 0.9, 0.95], 2, "minimize", True),
    ("maximize", 0.95, [0.5, 0.6, 0.9, 0.95], 2, "maximize", True),
    ("no value is never promoted", None, [None, None, None, None], 2, "minimize", False),
]


@pytest.mark.parametrize(("name", "value", "values", "reduction", "goal", "expected"), PROMOTIONS,
                         ids=[p[0] for p in PROMOTIONS])
def test_a_stopped_trial_is_promoted_when_it_ranks_among_the_kept(
        name: str, value: float | None, values: list[float | None], reduction: int, goal: str, expected: bool) -> None:
    assert asha.promotable(value, values, reduction, goal) is expected
    assert asha.keep(len(values), reduction) == len(values) // reduction
