"""The search space over plain values: a grid's points in their fixed order, a dimension's values
in a grid, a trial's config from the base, and what the base says against a key."""

from __future__ import annotations

import math
from typing import Any

import pytest

from db.vocabulary.config import parse_config
from db.vocabulary.config.sweep import Dimension, SweepConfig
from orchestrator.sweeps.space import (
    grid_point,
    grid_size,
    grid_values,
    key_problems,
    space_problems,
    trial_data,
    trial_name,
)


def sweep(space: dict[str, Any], **rest: Any) -> SweepConfig:
    config = parse_config({"sweep": {"space": space, **rest}}).sweep
    assert config is not None
    return config


@pytest.mark.parametrize(("dimension", "expected"), [
    ({"choice": ["cosine", "constant"]}, ["cosine", "constant"]),
    ({"int": [2, 5]}, [2, 3, 4, 5]),
    ({"int": [4, 4]}, [4]),
    ({"uniform": [0.0, 1.0], "points": 5}, [0.0, 0.25, 0.5, 0.75, 1.0]),
    ({"log_uniform": [1e-4, 1e-2], "points": 3}, [1e-4, 1e-3, 1e-2]),
    ({"uniform": [0.0, 1.0]}, None),  # a range without points has no grid
])
def test_a_dimensions_values_in_a_grid(dimension: dict[str, Any], expected: list[Any] | None) -> None:
    values = grid_values(Dimension.model_validate(dimension))
    assert values == (None if expected is None else pytest.approx(expected))
    if values is not None and "points" in dimension:
        bounds = dimension.get("uniform") or dimension["log_uniform"]
        assert values[0] == bounds[0]  # the bounds exactly


def test_the_grid_order_is_the_keys_as_written_the_first_slowest() -> None:
    grid = sweep({"workload.hidden": {"choice": [64, 128]}, "train.lr": {"choice": [0.1, 0.01, 0.001]}},
                 searcher="grid")
    assert grid_size(grid) == 6
    points = [grid_point(grid, n) for n in range(7)]
    assert points == [
        {"workload.hidden": 64, "train.lr": 0.1}, {"workload.hidden": 64, "train.lr": 0.01},
        {"workload.hidden": 64, "train.lr": 0.001}, {"workload.hidden": 128, "train.lr": 0.1},
        {"workload.hidden": 128, "train.lr": 0.01}, {"workload.hidden": 128, "train.lr": 0.001}, None]
    assert [list(p or {}) for p in points[:6]] == [["workload.hidden", "train.lr"]] * 6  # the keys in the file's order


def test_a_trials_config_is_the_base_with_its_values_its_name_and_its_sweeps_tag() -> None:
    base = parse_config({"name": "lr-search", "tags": ["nightly"], "train": {"lr": 0.5, "max_steps": 10}}).as_dict()
    data = trial_data(base, {"train.lr": 0.003, "workload.hidden": 64}, 7, "lr-search", 12)
    assert data["name"] == "lr-search-t12" and data["tags"] == ["nightly", "sweep:7"]
    assert data["train"]["lr"] == 0.003 and data["train"]["max_steps"] == 10 and data["workload"]["hidden"] == 64
    assert base["train"]["lr"] == 0.5  # the base is not changed
    assert parse_config(data).train.lr == 0.003
    assert trial_name("x" * 100, 3) == "x" * 97 + "-t3"  # a run's name: at most 100 characters


def test_a_key_is_judged_by_the_config_model_with_each_value_it_can_give() -> None:
    base = parse_config({})
    assert key_problems(base, "train.lr", Dimension.model_validate({"log_uniform": [1e-5, 1e-1]})) == []
    assert key_problems(base, "train.seed", Dimension.model_validate({"int": [-1, 3]})) == [
        'sweep.space."train.seed" int value -1: train.seed = -1: Input should be greater than or equal to 0']
    assert key_problems(base, "train.compile", Dimension.model_validate({"choice": [True, 1]})) == [
        'sweep.space."train.compile" choice value 1: train.compile = 1: Input should be a valid boolean '
        "(true or false, without quotes)"]
    assert key_problems(base, "workload.env", Dimension.model_validate({"choice": ["a"]})) == [
        'sweep.space."workload.env": workload.env is not a key of the base config (workload.kind = '
        "'mlp-digits'; docs/CONFIG.md lists them)"]


def test_a_sweep_file_needs_room_for_its_trials_tag() -> None:
    base = parse_config({"tags": [f"t{i}" for i in range(20)]})
    assert space_problems(base, sweep({"train.lr": {"uniform": [0.1, 1.0]}})) == [
        "tags: 20 tags leave no room for the tag each trial gets (sweep:<id>); at most 19 in a sweep file"]


def test_a_grid_too_large_is_refused() -> None:
    space = {f"train.{key}": {"int": [1, 100]} for key in ("max_steps", "batch_size", "log_every", "grad_accum")}
    assert math.prod([100] * 4) > 1_000_000
    assert space_problems(parse_config({}), sweep(space, searcher="grid"))[-1].startswith(
        "sweep.space: a grid of 100,000,000 points is more than 1,000,000")
