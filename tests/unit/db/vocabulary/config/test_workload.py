"""The [workload] section as one model per kind (issue 27, item 3): each kind parses to its own
class, a key of another kind is refused naming both kinds, configs stored from the flat model
of before still load, and a new config is stored with its kind's keys only.

    pytest tests/unit/db/vocabulary/config/test_workload.py
"""

from __future__ import annotations

import json

import pytest

from app.fork_changes import config_changes, overrides_for
from app.form import KIND_KEY, form_fields
from app.form_values import values_to_config, widget_values
from db.vocabulary.config import (
    ConfigError,
    GptCharWorkload,
    MlpDigitsWorkload,
    RunConfig,
    ScriptWorkload,
    config_from_json,
    deep_merge,
    parse_config,
    parse_toml,
)

# What an mlp-digits run's config_json held before the union: every kind's keys, with defaults.
FLAT_MLP_DIGITS = {
    "kind": "mlp-digits", "hidden": 512, "script": None, "module": None, "args": [], "workdir": None, "env": {},
    "python": None, "max_steps": 0, "checkpoint_glob": None, "checkpoint_step_key": None, "resume_args": [],
    "tensorboard_dir": None, "stdout_metrics": {}, "stop_signal": "SIGTERM", "text": None, "n_layer": 4,
    "n_head": 4, "n_embd": 128, "block_size": 128,
}


def problems_of(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


@pytest.mark.parametrize(("workload", "model"), [
    ({"kind": "mlp-digits", "hidden": 64}, MlpDigitsWorkload),
    ({"kind": "gpt-char", "n_layer": 2}, GptCharWorkload),
    ({"kind": "script", "script": "train.py"}, ScriptWorkload),
])
def test_each_kind_parses_to_its_own_class(workload: dict, model: type) -> None:
    config = parse_config({"workload": workload})
    assert type(config.workload) is model and config.workload.kind == workload["kind"]


def test_without_a_kind_it_is_mlp_digits() -> None:
    assert type(parse_config({}).workload) is MlpDigitsWorkload
    assert parse_config({"workload": {"hidden": 64}}).workload == MlpDigitsWorkload(hidden=64)


def test_a_key_of_another_kind_is_refused_naming_both_kinds() -> None:
    assert problems_of({"workload": {"kind": "gpt-char", "hidden": 64}}) == [
        "workload.hidden is only for kind = 'mlp-digits' (kind is 'gpt-char'); it is set to 64"]
    assert problems_of({"workload": {"n_layer": 8}}) == [
        "workload.n_layer is only for kind = 'gpt-char' (kind is 'mlp-digits'); it is set to 8"]
    assert problems_of({"workload": {"kind": "gpt-char", "script": "train.py"}}) == [
        "workload.script is only for kind = 'script' (kind is 'gpt-char'); it is set to 'train.py'"]


def test_a_key_of_another_kind_comes_with_the_other_problems() -> None:
    problems = problems_of({"workload": {"kind": "gpt-char", "n_head": 0, "hidden": 64}, "train": {"lr": -1.0}})
    assert problems[0].startswith("workload.n_head = 0")
    assert "workload.hidden is only for kind = 'mlp-digits' (kind is 'gpt-char'); it is set to 64" in problems
    assert any(p.startswith("train.lr = -1.0") for p in problems)


def test_an_unknown_kind_names_the_kinds_there_are() -> None:
    assert problems_of({"workload": {"kind": "rnn", "hidden": 64}}) == [
        "workload.kind = 'rnn': Input should be 'mlp-digits', 'gpt-char' or 'script'"]


def test_a_key_no_kind_has_is_an_unknown_key() -> None:
    assert problems_of({"workload": {"kind": "gpt-char", "n_layers": 8}}) == [
        "workload.n_layers: unknown key (value 8); check the spelling against docs/CONFIG.md"]


def test_a_config_stored_from_the_flat_model_loads() -> None:
    stored = json.dumps({"name": "old", "workload": FLAT_MLP_DIGITS}, sort_keys=True)
    config = config_from_json(stored)
    assert config.workload == MlpDigitsWorkload(hidden=512)
    gpt = {**FLAT_MLP_DIGITS, "kind": "gpt-char", "hidden": 256, "n_layer": 2}
    assert config_from_json(json.dumps({"workload": gpt})).workload == GptCharWorkload(n_layer=2)
    script = {**FLAT_MLP_DIGITS, "kind": "script", "hidden": 256, "script": "/w/train.py", "args": ["-v"]}
    assert config_from_json(json.dumps({"workload": script})).workload == ScriptWorkload(script="/w/train.py",
                                                                                         args=("-v",))


def test_a_key_of_another_kind_off_its_default_is_refused_when_written_and_ignored_when_stored() -> None:
    """The flat model accepted ``n_layer = 8`` on an mlp-digits run (and trained an MLP): such a
    run, stored, still opens; the same key in a config a person writes is refused."""
    flat = {**FLAT_MLP_DIGITS, "n_layer": 8}
    assert problems_of({"workload": flat}) == [
        "workload.n_layer is only for kind = 'gpt-char' (kind is 'mlp-digits'); it is set to 8"]
    assert config_from_json(json.dumps({"workload": flat})).workload == MlpDigitsWorkload(hidden=512)


def test_a_new_config_is_stored_with_its_kinds_keys_only() -> None:
    assert RunConfig().as_dict()["workload"] == {"kind": "mlp-digits", "hidden": 256}
    gpt = parse_config({"workload": {"kind": "gpt-char"}}).as_dict()["workload"]
    assert set(gpt) == {"kind", "text", "n_layer", "n_head", "n_embd", "block_size"}
    script = parse_config({"workload": {"kind": "script", "script": "t.py"}}).as_dict()["workload"]
    assert "hidden" not in script and "n_layer" not in script and script["script"] == "t.py"


@pytest.mark.parametrize("workload", [
    {"kind": "mlp-digits", "hidden": 64},
    {"kind": "gpt-char", "n_layer": 2, "text": "a.txt"},
    {"kind": "script", "script": "train.py", "args": ["--a", "b c"], "env": {"OMP_NUM_THREADS": "2"},
     "checkpoint_glob": "out/*.pt", "resume_args": ["--resume"], "stop_signal": "SIGINT"},
])
def test_stored_json_and_toml_round_trip(workload: dict) -> None:
    config = parse_config({"workload": workload})
    assert config_from_json(config.to_json()) == config
    # The TOML a "Download config" writes holds the same keys: read back, the same config.
    lines = [f"{key} = {json.dumps(value)}" for key, value in config.as_dict()["workload"].items()
             if value is not None and not isinstance(value, dict)]
    tables = [f"[workload.{key}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
              for key, value in config.as_dict()["workload"].items() if isinstance(value, dict)]
    text = "[workload]\n" + "\n".join(lines) + "\n" + "\n".join(tables)
    assert parse_config(parse_toml(text)) == config


def test_the_form_switching_kind_over_an_uploaded_config_is_not_refused() -> None:
    """An uploaded mlp-digits config with its own width, then gpt-char chosen on the form: the
    width the form no longer shows takes its default, and so does not refuse the run."""

    uploaded = {"workload": {"kind": "mlp-digits", "hidden": 512}}
    config = parse_config(deep_merge(uploaded, values_to_config({KIND_KEY: "gpt-char", "workload.n_layer": 2})))
    assert config.workload == GptCharWorkload(n_layer=2)


@pytest.mark.parametrize("stored", [RunConfig().as_dict()["workload"], FLAT_MLP_DIGITS])
def test_a_fork_on_the_form_changes_nothing_it_was_not_asked_to(stored: dict) -> None:
    """The New run form filled from a run's config (stored minimal, or flat from before) and
    left as it is: no change listed, no override sent; the width changed: that one only."""

    source = {**RunConfig().as_dict(), "workload": stored}
    values, _ = widget_values(source, form_fields(RunConfig, "mlp-digits"))
    applied = deep_merge(source, values_to_config(values))
    assert config_changes(source, applied) == [] and overrides_for(source, applied) == []
    applied = deep_merge(source, values_to_config({**values, "workload.hidden": 64}))
    assert overrides_for(source, applied) == ["workload.hidden=64"]
