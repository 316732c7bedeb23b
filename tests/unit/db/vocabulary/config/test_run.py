"""The whole run config and its checks across sections (db/vocabulary/config/run.py): the example
is the documented default, the config is frozen, bad values and unknown keys name the field and
the value, every problem comes in one answer, a script run refuses the built-in workloads'
settings, and the effective batch a change moves.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from app.form import form_fields
from db.vocabulary.config import (
    ConfigError,
    RunConfig,
    effective_batch_change,
    field_of,
    kind_problems,
    kinds_reading,
    load_config,
    parse_config,
)
from tests.unit.paths import ROOT


def test_example_config_is_the_documented_default() -> None:
    config = load_config(ROOT / "examples" / "digits.toml")
    assert config.name == "digits-ddp"
    assert config.workload.kind == "mlp-digits"
    assert config.launch.nproc_per_node == 2 and config.launch.backend == "auto"
    assert (config.train.max_steps, config.train.batch_size, config.train.lr) == (300, 64, 0.001)
    assert (config.train.seed, config.train.log_every, config.train.eval_every) == (0, 10, 100)


def test_config_is_frozen() -> None:
    config = RunConfig()
    with pytest.raises(ValidationError, match="frozen"):
        config.train.lr = 1.0


@pytest.mark.parametrize(
    ("data", "field", "value_text"),
    [
        ({"train": {"max_steps": 0}}, "train.max_steps", "0"),
        ({"train": {"lr": -0.1}}, "train.lr", "-0.1"),
        ({"train": {"batch_size": "big"}}, "train.batch_size", "'big'"),
        ({"launch": {"backend": "mpi"}}, "launch.backend", "'mpi'"),
        ({"workload": {"kind": "resnet"}}, "workload.kind", "'resnet'"),
        ({"name": "has space"}, "name", "'has space'"),
    ],
)
def test_bad_values_name_the_field_and_the_value(data: dict, field: str, value_text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    (problem,) = info.value.problems
    assert field_of(problem) == field
    assert value_text in problem


def test_unknown_keys_are_rejected_with_their_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"train": {"learning_rate": 0.1}, "colour": "red"})
    fields = sorted(field_of(p) for p in info.value.problems)
    assert fields == ["colour", "train.learning_rate"]
    assert all("unknown key" in p for p in info.value.problems)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"train": {"max_steps": 0, "lr": -1}, "launch": {"nproc_per_node": 0}})
    assert {field_of(p) for p in info.value.problems} == {"train.max_steps", "train.lr", "launch.nproc_per_node"}


# -- settings a script run does not read --------------------------------------------------------

SCRIPT = {"workload": {"kind": "script", "script": "train.py"}}


def test_a_script_run_refuses_the_built_in_workloads_settings_all_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**SCRIPT, "train": {"lr": 0.01, "max_steps": 5, "compile": True},
                      "workload": {**SCRIPT["workload"], "hidden": 512}})
    assert sorted(info.value.problems) == sorted([
        "train.lr = 0.01 applies to the built-in workloads only; a script sets its own learning rate",
        "train.max_steps = 5 applies to the built-in workloads only; a script sets its own max steps",
        "train.compile = True applies to the built-in workloads only; a script sets its own compile",
        "workload.hidden = 512 applies to mlp-digits only; a script sets its own hidden width",
    ])
    assert {field_of(p) for p in info.value.problems} == {"train.lr", "train.max_steps", "train.compile",
                                                          "workload.hidden"}


def test_a_script_run_keeps_what_it_uses_and_the_defaults() -> None:
    config = parse_config({**SCRIPT, "train": {"lr": 0.001}, "launch": {"nproc_per_node": 4},
                           "checkpoint": {"keep_last": 1, "async": False}, "retry": {"max_retries": 0},
                           "supervision": {"hang_timeout_s": 60.0}})
    assert config.launch.nproc_per_node == 4 and not config.checkpoint.async_save
    assert load_config(ROOT / "examples" / "script.toml").workload.kind == "script"
    # The built-in workloads still take every training setting.
    assert parse_config({"train": {"lr": 0.01, "max_steps": 5}}).train.lr == 0.01


def test_the_refusal_and_the_form_read_the_same_metadata() -> None:
    """Every field the New run form hides for a script is refused for one when not at its
    default, and nothing the form shows is."""
    shown = {spec.key for spec in form_fields(RunConfig, "script")}
    for section, info in RunConfig.model_fields.items():
        model = info.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for name in model.model_fields:
            key = f"{section}.{model.model_fields[name].alias or name}"
            kinds = kinds_reading(key)
            assert (kinds is None or "script" in kinds) == (key in shown), key
    assert kind_problems(RunConfig()) == []


def test_every_problem_of_a_config_comes_in_one_answer() -> None:
    """Issue 29, item 11: a section that fails no longer hides the checks around it, and a check
    across fields lists every contradiction, not the first."""
    with pytest.raises(ConfigError) as exc:
        parse_config({"workload": {"kind": "mlp-digits", "n_embd": 100, "n_head": 3},
                      "parallel": {"strategy": "fsdp"}, "train": {"precision": "fp16", "lr": -1.0,
                                                                   "activation_checkpointing": True}})
    problems = exc.value.problems
    # gpt-char's keys on an mlp-digits run: refused as such (one model per kind), not judged.
    assert problems[:2] == ["workload.n_embd is only for kind = 'gpt-char' (kind is 'mlp-digits'); it is set to 100",
                            "workload.n_head is only for kind = 'gpt-char' (kind is 'mlp-digits'); it is set to 3"]
    assert any(p.startswith("train.lr = -1.0") for p in problems)
    for contradiction in ("train.activation_checkpointing = true is for gpt-char",
                          "parallel.strategy = 'fsdp' is supported by gpt-char, not 'mlp-digits'",
                          "train.precision = 'fp16' with parallel.strategy = 'fsdp' is not supported"):
        assert sum(contradiction in p for p in problems) == 1, (contradiction, problems)


def test_a_check_across_fields_does_not_judge_a_default_in_place_of_a_wrong_value() -> None:
    """n_head is wrong on its own: n_embd is not judged against n_head's default instead."""
    with pytest.raises(ConfigError) as exc:
        parse_config({"workload": {"kind": "gpt-char", "n_embd": 102, "n_head": "three"}})  # 102 % 4 (the default)
    assert len(exc.value.problems) == 1 and exc.value.problems[0].startswith("workload.n_head = 'three'")


def test_effective_batch_change_names_the_numbers_and_the_accumulation_that_keeps_it() -> None:
    parent = RunConfig().as_dict()
    assert effective_batch_change(parent, parent) is None
    halved = RunConfig.model_validate({"launch": {"nproc_per_node": 1}}).as_dict()
    note = effective_batch_change(parent, halved)
    assert note == ("the effective batch (ranks x train.batch_size x train.grad_accum) changes from 2 x 64 x 1 = 128 "
                    "to 1 x 64 x 1 = 64 samples per step; train.grad_accum = 2 would keep 128")
    kept = RunConfig.model_validate({"launch": {"nproc_per_node": 1}, "train": {"grad_accum": 2}}).as_dict()
    assert effective_batch_change(parent, kept) is None
    odd = RunConfig.model_validate({"launch": {"nproc_per_node": 3}}).as_dict()
    assert effective_batch_change(parent, odd).endswith("= 192 samples per step")  # type: ignore[union-attr]


@pytest.mark.parametrize(("section", "field", "value"), [
    ("workload", "workdir", "\x00"),
    ("workload", "script", "train\x00.py"),
    ("workload", "args", ["--ok", "b\x00"]),
    ("workload", "env", {"A": "x\x00"}),
    ("checkpoint", "best_metric", "eval\x00loss"),
])
def test_a_nul_character_anywhere_is_refused_naming_the_field(section: str, field: str, value: object) -> None:
    """TOML allows "\\u0000"; no path, argument or environment value can hold it, and Python raised
    ValueError on the first path check after the config had been accepted (Hypothesis found
    workload.workdir = "\\x00")."""
    base = {"kind": "script", "script": "t.py"} if section == "workload" else {}
    with pytest.raises(ConfigError) as err:
        parse_config({section: {**base, field: value}})
    assert err.value.problems == [next(p for p in err.value.problems if p.startswith(f"{section}.{field}"))]
    assert "NUL character" in err.value.problems[0]


def test_a_warmup_longer_than_the_run_is_refused_naming_both_fields() -> None:
    """Issue 56, item 6: train.warmup_steps > train.max_steps never reaches train.lr."""
    with pytest.raises(ConfigError) as exc:
        parse_config({"train": {"max_steps": 100, "warmup_steps": 500}})
    (problem,) = exc.value.problems
    assert problem.startswith("train.warmup_steps = 500: more than train.max_steps = 100"), problem
    assert parse_config({"train": {"max_steps": 100, "warmup_steps": 100}}).train.warmup_steps == 100
