"""The arithmetic before Start: how many trials reach each rung, the steps they train together, the
full-run equivalents, and device-hours and dollars at the pace of an alike run."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt
from db.requests import create_run
from db.vocabulary.config import parse_config
from db.vocabulary.cost import Price
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.sweeps.preview import preview, reaching, steps_trained

CPU = Inventory(kind="cpu", slots=4)


@pytest.mark.parametrize(("trials", "rungs", "reduction", "max_steps", "counts", "steps"), [
    (27, [10, 30, 90], 3, 270, [27, 9, 3, 1], 27 * 10 + 9 * 20 + 3 * 60 + 1 * 180),
    (9, [10, 30], 3, 90, [9, 3, 1], 9 * 10 + 3 * 20 + 1 * 60),
    (8, [10, 20], 2, 40, [8, 4, 2], 8 * 10 + 4 * 10 + 2 * 20),
    (2, [10, 30], 3, 90, [2, 1, 1], 2 * 10 + 1 * 20 + 1 * 60),  # the best always goes on to the end
    (5, [], 3, 100, [5], 500),  # no early stop: every trial trains to the end
])
def test_how_many_reach_each_rung_and_the_steps(trials: int, rungs: list[int], reduction: int, max_steps: int,
                                                counts: list[int], steps: int) -> None:
    assert reaching(trials, rungs, reduction) == counts
    assert steps_trained(trials, rungs, reduction, max_steps) == steps


def sweep_config(**sweep: Any) -> Any:
    return parse_config({"name": "p", "launch": {"nproc_per_node": 2}, "train": {"max_steps": 270},
                         "checkpoint": {"every_steps": 10},
                         "sweep": {"max_trials": 27, "max_concurrent": 3, "space": {"train.lr": {"uniform": [0.1, 1]}},
                                   **sweep}})


def test_without_a_pace_the_counts_and_no_hours() -> None:
    p = preview(None, sweep_config(early_stop={"min_steps": 10, "reduction": 3}, budget={"usd": 0.01}), CPU)
    assert (p.trials, p.max_steps, p.devices, p.max_concurrent) == (27, 270, 2, 3)
    assert p.rungs == [{"rung": 0, "step": 10, "trials": 27}, {"rung": 1, "step": 30, "trials": 9},
                       {"rung": 2, "step": 90, "trials": 3}]
    assert p.steps == 810 and p.full_runs == pytest.approx(3.0)  # 27 trials for the price of 3 full runs
    assert p.device_hours is None and p.usd is None and p.wall_hours is None
    assert p.as_dict()["rungs"][2]["trials"] == 3


def test_with_the_pace_of_an_alike_run(sessions: sessionmaker[Session], settings: Settings) -> None:
    config = sweep_config()  # no early stop: 27 full runs
    with sessions() as s:
        run = create_run(s, config.base(), settings.runs_dir, Price(1.0, "test"))
        run.started_at = 1000.0
        s.add(Attempt(run_id=run.id, number=1, status="SUCCEEDED", dir="/x", started_at=1000.0, first_step_at=1002.0,
                      ended_at=1029.0, last_step=270))  # 10 steps a second, 2 s to start
        s.commit()
        p = preview(s, config, CPU)
    assert p.like_run == run.id and p.seconds_per_step == pytest.approx(0.1)
    seconds = 27 * 270 * 0.1 + 27 * 2.0
    assert p.device_hours == pytest.approx(seconds * 2 / 3600)
    assert p.usd == pytest.approx(seconds * p.usd_per_hour / 3600)
    assert p.wall_hours == pytest.approx(seconds / 3 / 3600)  # 3 at a time
    grid = preview(None, sweep_config(searcher="grid", space={"workload.hidden": {"choice": [32, 64]}}), CPU)
    assert grid.trials == 2  # a grid smaller than max_trials
