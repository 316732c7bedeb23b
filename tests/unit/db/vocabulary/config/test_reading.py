"""Reading a run config (db/vocabulary/config/reading.py): TOML a person writes, ``--set``
overrides as typed TOML values, JSON that round-trips with a stable hash, a mapping from the UI,
and the errors each gives for a mistake, naming the key.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from db.vocabulary.config import ConfigError, apply_overrides, config_from_json, load_config, parse_config, parse_toml


def test_json_round_trip_and_hash_are_stable() -> None:
    config = parse_config({"name": "a", "train": {"lr": 0.01}})
    again = config_from_json(config.to_json())
    assert again == config
    assert again.config_hash() == config.config_hash()
    assert parse_config({"name": "a", "train": {"lr": 0.02}}).config_hash() != config.config_hash()


def test_bad_toml_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_toml("name = \n[train")


def test_overrides_are_typed_toml_values() -> None:
    data = apply_overrides({"train": {"lr": 0.001}},
                           ["train.lr=0.0005", "name=fast", "launch.nproc_per_node=1", "tags=['a', 'b']"])
    config = parse_config(data)
    assert config.train.lr == 0.0005 and config.name == "fast"
    assert config.launch.nproc_per_node == 1 and config.tags == ("a", "b")


def test_override_without_equals_is_rejected() -> None:
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["train.lr"])


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")


def test_a_mapping_from_the_ui_with_a_date_or_deep_nesting_is_refused_naming_the_key() -> None:
    """The New run page hands validate() a mapping (its upload through parse_toml, its form as a
    dict): a date or a 2,000-deep table there is one ConfigError naming the key, not a TypeError
    or RecursionError later when the config is stored as JSON."""
    with pytest.raises(ConfigError, match=r"name = 1979-05-27: a TOML date/time"):
        parse_config({"name": datetime.date(1979, 5, 27)})
    deep: dict = {}
    node = deep
    for _ in range(2000):
        node["t"] = {}
        node = node["t"]
    with pytest.raises(ConfigError, match=r"t\.t\.t.*nested more than 32 deep"):
        parse_config({"workload": deep})
    with pytest.raises(ConfigError, match=r"^invalid run config:\n  - x: nested more than 32 deep"):
        parse_toml("x = " + "[" * 5000 + "]" * 5000)
