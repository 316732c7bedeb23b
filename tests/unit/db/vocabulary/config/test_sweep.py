"""The [sweep] section on its own: every bad dimension or value refused before anything is queued,
each problem naming the key; a sweep file is a run config with the section, and a run's own config
(a trial's, every stored one) has none, so its JSON and hash are what they were."""

from __future__ import annotations

from typing import Any

import pytest

from db.vocabulary.config import ConfigError, RunConfig, parse_config, parse_toml, reference_markdown
from db.vocabulary.config.sweep import Dimension, SweepConfig

SWEEP_FILE = """
name = "lr-search"
[train]
max_steps = 60
[sweep]
metric = "eval_loss"
goal = "minimize"
searcher = "random"
max_trials = 9
max_concurrent = 2
seed = 7
[sweep.space]
"train.lr" = {log_uniform = [1e-4, 1e-2]}
"workload.hidden" = {choice = [32, 64, 128]}
"train.batch_size" = {int = [16, 64]}
"train.weight_decay" = {uniform = [0.0, 0.1], points = 3}
[sweep.early_stop]
kind = "asha"
reduction = 3
min_steps = 10
[sweep.budget]
gpu_hours = 2.5
usd = 10
wall_hours = 1
max_failed = 2
"""


def test_a_sweep_file_is_a_run_config_with_a_sweep_section() -> None:
    config = parse_config(parse_toml(SWEEP_FILE))
    sweep = config.sweep
    assert sweep is not None
    assert (sweep.metric, sweep.goal, sweep.searcher, sweep.max_trials, sweep.max_concurrent, sweep.seed) == (
        "eval_loss", "minimize", "random", 9, 2, 7)
    assert {key: d.kind for key, d in sweep.space.items()} == {
        "train.lr": "log_uniform", "workload.hidden": "choice", "train.batch_size": "int",
        "train.weight_decay": "uniform"}
    assert list(sweep.space) == ["train.lr", "workload.hidden", "train.batch_size", "train.weight_decay"]  # as written
    assert sweep.early_stop is not None and (sweep.early_stop.reduction, sweep.early_stop.min_steps) == (3, 10)
    assert (sweep.budget.gpu_hours, sweep.budget.usd, sweep.budget.wall_hours, sweep.budget.max_failed) == (
        2.5, 10.0, 1.0, 2)
    assert config.base().sweep is None and config.base().train.max_steps == 60


def test_a_run_config_without_a_sweep_stores_no_sweep_key() -> None:
    plain = RunConfig(name="x")
    assert "sweep" not in plain.as_dict()
    assert "sweep" not in parse_config(parse_toml(SWEEP_FILE)).base().as_dict()
    assert parse_config(parse_toml(SWEEP_FILE)).as_dict()["sweep"]["space"]["train.batch_size"]["int"] == [16, 64]


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("empty space", {"space": {}}, "sweep.space: the space is empty"),
    ("no space at all", {"metric": "loss"}, "sweep.space: the space is empty"),
    ("log range at 0", {"space": {"train.lr": {"log_uniform": [0, 1e-2]}}},
     'sweep.space."train.lr": log_uniform = [0.0, 0.01]: a log range needs both bounds above 0'),
    ("log range below 0", {"space": {"train.lr": {"log_uniform": [-1e-3, 1e-2]}}},
     'sweep.space."train.lr": log_uniform = [-0.001, 0.01]: a log range needs both bounds above 0'),
    ("bounds the wrong way", {"space": {"train.lr": {"uniform": [0.1, 0.01]}}},
     'sweep.space."train.lr": uniform = [0.1, 0.01]: the low bound must be below the high one'),
    ("an infinite bound", {"space": {"train.lr": {"uniform": [0.1, float("inf")]}}},
     'sweep.space."train.lr": uniform = [0.1, inf]: the bounds must be finite'),
    ("two kinds", {"space": {"train.lr": {"uniform": [0.1, 1], "choice": [0.1]}}},
     'sweep.space."train.lr": give exactly one of `log_uniform`, `uniform`, `int`, `choice` (here: uniform, choice)'),
    ("no kind", {"space": {"train.lr": {}}}, 'sweep.space."train.lr": give exactly one of'),
    ("an empty choice", {"space": {"train.lr": {"choice": []}}},
     'sweep.space."train.lr".choice = []: List should have at least 1 item'),
    ("a repeated choice", {"space": {"workload.hidden": {"choice": [64, 64]}}},
     'sweep.space."workload.hidden": choice = [64, 64]: 64 is given twice'),
    ("a range of one bound", {"space": {"train.lr": {"uniform": [0.1]}}},
     'sweep.space."train.lr".uniform = [0.1]: List should have at least 2 items'),
    ("an int range of floats", {"space": {"workload.hidden": {"int": [8.0, 64]}}},
     'sweep.space."workload.hidden".int.0 = 8.0: Input should be a valid integer'),
    ("a string bound", {"space": {"train.lr": {"uniform": [0.1, "1"]}}},
     "sweep.space.\"train.lr\".uniform.1 = '1': Input should be a valid number"),
    ("points on a choice", {"space": {"workload.hidden": {"choice": [8, 16], "points": 3}}},
     'sweep.space."workload.hidden": points = 3: only a `uniform` or `log_uniform` range takes points'),
    ("one point", {"space": {"train.lr": {"uniform": [0.1, 1], "points": 1}}},
     'sweep.space."train.lr".points = 1: Input should be greater than or equal to 2'),
    ("not a dotted key", {"space": {"lr": {"uniform": [0.1, 1]}}},
     "sweep.space: 'lr': not a config key; write the section and the key"),
    ("the sweep's own key", {"space": {"sweep.seed": {"int": [0, 3]}}},
     "sweep.space: 'sweep.seed': a sweep cannot search its own settings"),
    ("an unknown kind of dimension", {"space": {"train.lr": {"loguniform": [1e-4, 1e-2]}}},
     'sweep.space."train.lr".loguniform: unknown key'),
    ("a goal misspelt", {"goal": "min", "space": {"train.lr": {"uniform": [0.1, 1]}}},
     "sweep.goal = 'min': Input should be 'minimize' or 'maximize'"),
    ("an unknown searcher", {"searcher": "bayes", "space": {"train.lr": {"uniform": [0.1, 1]}}},
     "sweep.searcher = 'bayes': Input should be 'grid', 'random' or 'tpe'"),
    ("no trial", {"max_trials": 0, "space": {"train.lr": {"uniform": [0.1, 1]}}},
     "sweep.max_trials = 0: Input should be greater than or equal to 1"),
    ("none at once", {"max_concurrent": 0, "space": {"train.lr": {"uniform": [0.1, 1]}}},
     "sweep.max_concurrent = 0: Input should be greater than or equal to 1"),
    ("a reduction of 1", {"early_stop": {"reduction": 1}, "space": {"train.lr": {"uniform": [0.1, 1]}}},
     "sweep.early_stop.reduction = 1: Input should be greater than or equal to 2"),
    ("an early stop of another kind", {"early_stop": {"kind": "median"}, "space": {"train.lr": {"uniform": [0.1, 1]}}},
     "sweep.early_stop.kind = 'median': Input should be 'asha'"),
    ("a negative budget", {"budget": {"usd": -1}, "space": {"train.lr": {"uniform": [0.1, 1]}}},
     "sweep.budget.usd = -1: Input should be greater than or equal to 0"),
    ("a misspelt budget key", {"budget": {"dollars": 5}, "space": {"train.lr": {"uniform": [0.1, 1]}}},
     "sweep.budget.dollars: unknown key"),
]


@pytest.mark.parametrize(("section", "expected"), [(s, e) for _, s, e in BAD], ids=[name for name, _, _ in BAD])
def test_a_bad_sweep_section_is_refused_naming_the_key(section: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"sweep": section})
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems


def test_every_problem_of_a_dimension_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"sweep": {"space": {"train.lr": {"log_uniform": [1e-2, -1.0]}}}})
    assert caught.value.problems == [
        'sweep.space."train.lr": log_uniform = [0.01, -1.0]: the low bound must be below the high one',
        'sweep.space."train.lr": log_uniform = [0.01, -1.0]: a log range needs both bounds above 0',
    ]


def test_choices_keep_their_toml_types() -> None:
    # 1, 1.0 and true are three values, each of its own type: the key's type judges them later.
    d = Dimension.model_validate({"choice": [1, 1.0, True, "1"]})
    assert [type(v) for v in d.choice or []] == [int, float, bool, str]
    assert d.kind == "choice" and Dimension.model_validate({"int": [2, 2]}).values_of("int") == [2, 2]


def test_config_reference_documents_every_sweep_key() -> None:
    text = reference_markdown()
    for heading in ("## [sweep]", "### [sweep.space]", "### [sweep.early_stop]", "### [sweep.budget]"):
        assert heading in text
    for key in (*SweepConfig.model_fields, "log_uniform", "uniform", "int", "choice", "points", "reduction",
                "min_steps", "gpu_hours", "usd", "wall_hours", "max_failed"):
        if key not in ("space", "early_stop", "budget"):
            assert f"| `{key}` |" in text, key
