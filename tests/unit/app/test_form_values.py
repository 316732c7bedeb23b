"""The New run form's widget values (app/form_values.py), to a config and back, checked without a
browser: the same config back, defaults for the fields a kind does not read, text, lists and
tables read from their boxes, values no widget can hold shown with a note, and every wrong value
refused through the usual validation.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.form import KIND_KEY, form_fields
from app.form_values import config_value, table_value, values_to_config, widget_bounds, widget_values
from db.vocabulary.config import ConfigError, RunConfig, ScriptWorkload, parse_config
from orchestrator.submission import validate
from tests.unit.app.form_specs import CPU, by_key

# -- widget values to a config, and back ------------------------------------------------------


SCRIPT_CONFIG = {"workload": {"kind": "script", "script": "train.py", "args": ["--steps", "5", "--name", "a b"]}}


@pytest.mark.parametrize("data", [{}, {"workload": {"kind": "gpt-char", "n_layer": 6, "text": "a.txt"}},
                                  SCRIPT_CONFIG], ids=["default", "gpt-char", "script"])
def test_the_widget_values_of_a_config_give_the_same_config_back(data: dict[str, Any]) -> None:
    config = parse_config(data)
    values, notes = widget_values(config.as_dict(), form_fields(RunConfig, config.workload.kind))
    assert notes == []
    assert parse_config(values_to_config(values)) == config


def test_the_default_widget_values_give_the_default_config() -> None:
    values, _ = widget_values(RunConfig().as_dict(), form_fields(RunConfig, "mlp-digits"))
    assert values["train.lr"] == 0.001 and values["tags"] == "" and values["workload.hidden"] == 256
    # Every kind's workload keys come back, other kinds' at their defaults (dropped when read).
    assert RunConfig.model_validate(values_to_config(values)).as_dict() == RunConfig().as_dict()
    assert RunConfig.model_validate(values_to_config(values)) == RunConfig()


def test_fields_that_do_not_apply_to_the_kind_take_their_defaults() -> None:
    out = values_to_config({KIND_KEY: "mlp-digits", "train.activation_checkpointing": True, "workload.n_layer": 8,
                            "workload.script": "x.py", "workload.args": "--a", "parallel.strategy": "fsdp"})
    assert out["train"]["activation_checkpointing"] is False and out["workload"]["n_layer"] == 4
    assert (out["workload"]["script"], out["workload"]["args"], out["parallel"]["strategy"]) == (None, [], "ddp")
    assert "max_steps" not in out["train"]  # not given: left to the base it is merged into
    parse_config(out)


def test_text_and_lists_are_read_from_their_boxes() -> None:
    specs = by_key(form_fields(RunConfig))
    assert config_value(specs["name"], "  my-run ") == "my-run"
    assert config_value(specs["workload.text"], "  ") is None
    assert config_value(specs["tags"], "ui, , smoke ,") == ["ui", "smoke"]
    assert config_value(specs["workload.args"], "--name 'a b' -v") == ["--name", "a b", "-v"]
    assert config_value(specs["train.max_steps"], 12.5) == 12.5  # numbers are not coerced


def test_an_int_field_refuses_a_float_through_the_validation() -> None:
    values, _ = widget_values(RunConfig().as_dict(), form_fields(RunConfig, "mlp-digits"))
    values |= {"train.max_steps": 12.5, "launch.nproc_per_node": 1.0, "train.lr": -1.0}
    with pytest.raises(ConfigError) as refused:
        validate(values_to_config(values), CPU)
    problems = " | ".join(refused.value.problems)
    assert "train.max_steps = 12.5" in problems and "launch.nproc_per_node = 1.0" in problems
    assert "whole number" in problems and "train.lr = -1.0" in problems


def test_an_unclosed_quote_in_the_arguments_is_refused_naming_the_field() -> None:
    values = {KIND_KEY: "script", "workload.script": __file__, "workload.args": "--name 'a b"}
    with pytest.raises(ConfigError) as refused:
        validate(values_to_config(values), CPU)
    assert any(p.startswith("workload.args = \"--name 'a b\"") for p in refused.value.problems), refused.value


def test_values_no_widget_can_hold_show_the_default_with_a_note() -> None:
    data = {"train": {"max_steps": "many", "lr": 0.5, "batch_size": 32.0}, "workload": {"kind": "rnn"},
            "tags": ["a", 1], "launch": "two"}
    values, notes = widget_values(data, form_fields(RunConfig))
    assert (values["train.max_steps"], values["train.lr"], values["train.batch_size"]) == (300, 0.5, 32)
    assert (values[KIND_KEY], values["tags"], values["launch.nproc_per_node"]) == ("mlp-digits", "", 2)
    assert [note.split(" = ")[0] for note in notes] == ["tags", "workload.kind", "train.max_steps"]


def test_a_bound_the_value_already_breaks_is_dropped_so_the_page_draws() -> None:
    specs = by_key(form_fields(RunConfig))
    assert widget_bounds(specs["workload.n_layer"], 4) == (1, 96)
    assert widget_bounds(specs["workload.n_layer"], 0) == (None, 96)
    assert widget_bounds(specs["workload.n_layer"], 200) == (1, None)


def test_tables_are_written_one_name_a_line_and_read_back() -> None:
    data = {"workload": {"kind": "script", "script": "train.py", "env": {"OMP_NUM_THREADS": "4", "HF_HOME": "/d"},
                         "stdout_metrics": {"loss": r"iter (?P<step>\d+): loss (?P<value>[\d.]+)"}}}
    fields = form_fields(RunConfig, "script")
    values, notes = widget_values(data, fields)
    assert notes == []
    assert values["workload.env"] == "OMP_NUM_THREADS = 4\nHF_HOME = /d"
    workload = parse_config(values_to_config(values)).workload
    assert isinstance(workload, ScriptWorkload) and workload.stdout_metrics == data["workload"]["stdout_metrics"]
    assert table_value("A = 1\n\n  B=x=y  \n") == {"A": "1", "B": "x=y"}
    # A line without "=" goes to the validation as text, which names the field.
    with pytest.raises(ConfigError, match=r"workload\.env"):
        parse_config(values_to_config({**values, "workload.env": "OMP_NUM_THREADS 4"}))
