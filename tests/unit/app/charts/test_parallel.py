"""The parallel coordinates' data (app/charts/parallel.py): an axis per key of the space in its
scale and one for the objective, a line per trial coloured by its value, and the brush's
selection as the page reads it; for the Runs page, an axis per config key that differs among the
selected runs and one for the best loss, a line per run."""

from __future__ import annotations

import math
from typing import Any

from app.charts.metric import spans_decades
from app.charts.parallel import (
    ABSENT,
    MISSING_COLOR,
    VIRIDIS,
    brush_words,
    drawn_keys,
    objective_colors,
    parallel_data,
    runs_parallel_data,
    selected_numbers,
)
from app.charts.runs_analysis import grouped
from db import compare

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


def test_the_runs_pages_lines_an_axis_per_differing_key_then_the_best_loss() -> None:
    runs = [{"id": 4, "name": "a", "best_loss": 0.5}, {"id": 7, "name": "b", "best_loss": 0.001},
            {"id": 9, "name": "c", "best_loss": None}]
    diff: list[tuple[str, list[Any]]] = [("train.lr", [1e-5, 1e-2, 1e-3]), ("train.batch_size", [32, 64, ABSENT]),
            ("workload.kind", ["mlp-digits", "script", "mlp-digits"]), ("train.amp", [True, False, True])]
    d = runs_parallel_data(runs, diff)
    lr, batch, kind, amp, loss = d["axes"]
    assert (lr["kind"], lr["min"], lr["max"]) == ("log", 1e-5, 1e-2)  # more than two decades: log
    assert (batch["kind"], batch["min"], batch["max"]) == ("linear", 32, 64)
    assert kind["choices"] == ["mlp-digits", "script"] and amp["choices"] == ["false", "true"]
    assert (loss["key"], loss["label"], loss["kind"], loss["min"], loss["max"]) == (
        "objective", "best loss", "log", 0.001, 0.5)
    assert [line["number"] for line in d["trials"]] == [4, 7, 9]
    assert d["trials"][0]["label"] == "run #4 a" and d["noun"] == ["run", "runs"]
    assert d["trials"][2]["values"] == [1e-3, None, "mlp-digits", "true", None]
    assert [line["color"] for line in d["trials"]] == [VIRIDIS[0], VIRIDIS[-1], MISSING_COLOR]  # bright: lowest


def test_absent_is_the_compare_pages_mark() -> None:
    assert ABSENT == compare.ABSENT


def test_the_axes_drawn_are_the_keys_with_two_values_or_more_most_runs_having_them_first() -> None:
    diff: list[tuple[str, list[Any]]] = [
        ("workload.args", [ABSENT, ABSENT, []]),  # one run's only: nothing to compare
        ("workload.hidden", [256, 256, ABSENT]),  # one value where known
        ("workload.script", [ABSENT, "a.py", "b.py"]),
        ("train.lr", [0.1, 0.01, 0.001]),
    ]
    assert [k for k, _ in drawn_keys(diff, 10)] == ["train.lr", "workload.script"]
    assert [k for k, _ in drawn_keys(diff, 1)] == ["train.lr"]


def test_the_runs_axes_go_log_by_the_rule_of_every_log_axis() -> None:
    """More than two decades, strictly, as a metric's chart and Compare (app/charts/metric.py's
    spans_decades); exactly two stay linear. A choice reads as the Runs list's group label."""
    def kinds(lrs: list[float], losses: list[float]) -> list[str]:
        runs = [{"id": i, "name": f"r{i}", "best_loss": loss} for i, loss in enumerate(losses)]
        return [a["kind"] for a in runs_parallel_data(runs, [("train.lr", lrs)])["axes"]]

    assert kinds([0.001, 0.1], [0.01, 1.0]) == ["linear", "linear"]  # two decades: linear, as the charts
    assert kinds([0.001, 0.11], [0.01, 1.5]) == ["log", "log"]
    for values, decades in (([0.01, 1.0], False), ([0.01, 1.5], True)):
        assert spans_decades([{"value": v} for v in values]) is decades
    runs = [{"id": 1, "name": "a", "best_loss": 0.1}, {"id": 2, "name": "b", "best_loss": 0.2}]
    data = runs_parallel_data(runs, [("train.flag", [True, 1e-7])])
    assert data["axes"][0]["choices"] == ["1e-07", "true"]
    assert [g.label for g in grouped(runs, {1: {"f": True}, 2: {"f": 1e-7}}, "f")] == ["1e-07", "true"]
