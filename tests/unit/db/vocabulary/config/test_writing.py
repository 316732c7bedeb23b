"""A config written back as TOML reads back to the same config (`runyard sweep best` prints one to
submit), and a --set override names a key with a dot in it by quoting it, as TOML does."""

from __future__ import annotations

import pytest

from db.vocabulary.config import ConfigError, apply_overrides, parse_config, parse_toml
from db.vocabulary.config.reading import key_parts
from db.vocabulary.config.writing import toml_document, toml_key


@pytest.mark.parametrize("data", [
    {},
    {"name": "run-1", "tags": ["a", "sweep:3"], "train": {"lr": 1e-05, "max_steps": 7, "compile": True}},
    {"workload": {"kind": "script", "script": "/x/train.py", "args": ["--lr", "0.1"], "env": {"A_B": "ünï \"1\""},
                  "stdout_metrics": {"val.loss": r"step (?P<step>\d+) (?P<value>\S+)"}}},
    {"sweep": {"space": {"train.lr": {"log_uniform": [1e-4, 1e-2]}}, "early_stop": {"min_steps": 10}}},
])
def test_a_config_written_as_toml_reads_back_the_same(data: dict) -> None:
    config = parse_config(data)
    assert parse_config(parse_toml(toml_document(config.as_dict()))) == config


def test_keys_are_bare_where_they_can_be() -> None:
    assert toml_key("max_steps") == "max_steps" and toml_key("train.lr") == '"train.lr"'
    assert toml_document({"a": 1, "t": {"b": None, "c": "x"}, "e": {}}) == 'a = 1\n\n[t]\nc = "x"\n\n[e]'


@pytest.mark.parametrize(("key", "parts"), [
    ("train.lr", ["train", "lr"]),
    ('sweep.space."train.lr"', ["sweep", "space", "train.lr"]),
    (' sweep . max_trials ', ["sweep", "max_trials"]),
    ("train..lr", None),
    ('sweep."train.lr', None),  # a quote left open
])
def test_a_dotted_key_keeps_a_quoted_part_whole(key: str, parts: list[str] | None) -> None:
    assert key_parts(key) == parts


def test_an_override_sets_a_key_of_the_space() -> None:
    data = apply_overrides({"sweep": {"space": {}}}, ['sweep.space."train.lr"={uniform = [0.1, 1.0]}'])
    assert data == {"sweep": {"space": {"train.lr": {"uniform": [0.1, 1.0]}}}}
    with pytest.raises(ConfigError, match="a quote left open"):
        apply_overrides({}, ['sweep.space."train.lr=1'])
