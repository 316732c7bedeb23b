"""The parallel coordinates' data (app/charts/parallel.py): an axis per key of the space in its
scale and one for the objective, a line per trial coloured by its value, and the brush's
selection as the page reads it."""

from __future__ import annotations

import math
from typing import Any

from app.charts.parallel import (
    MISSING_COLOR,
    VIRIDIS,
    brush_words,
    objective_colors,
    parallel_data,
    selected_numbers,
)

SPACE: dict[str, dict[str, Any]] = {
    "train.lr": {"log_uniform": [1e-4, 1e-2], "uniform": None, "int": None, "choice": None},
    "train.batch_size": {"log_uniform": None, "uniform": None, "int": [16, 64], "choice": None},
    "train.schedule": {"log_uniform": None, "uniform": None, "int": None, "choice": ["cosine", True]},
}


def trial(number: int, value: float | None, lr: float = 1e-3, batch: int = 32,
          schedule: object = "cosine") -> dict[str, Any]:
    return {"number": number, "value": value,
            "params": {"train.lr": lr, "train.batch_size": batch, "train.schedule": schedule}}


def test_an_axis_per_key_in_its_scale_then_the_objective() -> None:
    d = parallel_data(SPACE, [trial(0, 0.5, batch=80), trial(1, None, schedule=True)], "eval_loss", "minimize")
    lr, batch, schedule, objective = d["axes"]
    assert (lr["kind"], lr["min"], lr["max"]) == ("log", 1e-4, 1e-2)
    assert (batch["kind"], batch["min"], batch["max"]) == ("linear", 16, 80)  # widened to a value seen
    assert schedule == {"key": "train.schedule", "label": "train.schedule", "kind": "choice",
                        "choices": ["cosine", "True"]}
    assert objective["label"] == "eval_loss (minimize)" and objective["objective"]
    first, second = d["trials"]
    assert first["values"] == [1e-3, 80, "cosine", 0.5]
    assert second["values"][2:] == ["True", None] and second["color"] == MISSING_COLOR


def test_colours_are_bright_for_the_better_value_whichever_the_goal() -> None:
    assert objective_colors([0.1, 0.9, None, math.nan], "minimize") == [VIRIDIS[-1], VIRIDIS[0], MISSING_COLOR,
                                                                         MISSING_COLOR]
    assert objective_colors([0.1, 0.9], "maximize") == [VIRIDIS[0], VIRIDIS[-1]]
    assert objective_colors([0.3, 0.3], "minimize")[0] == objective_colors([0.3], "maximize")[0]  # all alike: mid


def test_the_selection_keeps_the_trials_still_there_and_says_its_brushes() -> None:
    selection = {"numbers": [3, 1, 99, "x"], "brushes": {"train.lr": {"from": 0.001, "to": 0.01},
                                                         "train.schedule": {"values": ["cosine"]},
                                                         "objective": {"from": 0.2, "to": 0.25}}}
    assert selected_numbers(selection, [0, 1, 2, 3]) == [1, 3]
    assert selected_numbers(None, [0, 1]) is None and selected_numbers({"numbers": None}, [0]) is None
    assert brush_words(selection) == "train.lr 0.001 to 0.01; train.schedule in cosine; the objective 0.2 to 0.25"
