"""What a fork changes (app/fork_changes.py): the settings that differ from the source run, and
the ``key=value`` overrides a fork request takes, read back exactly by the CLI's parser.

    pytest tests/unit/app/test_fork_changes.py
"""

from __future__ import annotations

import copy
import math

import pytest

from app.fork_changes import config_changes, overrides_for
from db.vocabulary.config import RunConfig, apply_overrides, parse_override
from db.vocabulary.config.writing import toml_value


@pytest.mark.parametrize("value", [True, False, 0, -7, 2**40, 0.0005, 1e-05, 3.0, "plain", 'quote " and \\ back',
                                   "ünïcode\ttab", ["a", "b c"], [], {"A": "x y", "B": "1"}])
def test_a_value_written_as_toml_is_read_back_by_the_override_parser(value: object) -> None:
    assert parse_override(f"k={toml_value(value)}")[1] == value


def test_infinite_and_nan_floats_are_written_as_toml_reads_them() -> None:
    assert parse_override(f"k={toml_value(math.inf)}")[1] == math.inf
    assert math.isnan(parse_override(f"k={toml_value(math.nan)}")[1])


def test_none_cannot_be_an_override_and_the_message_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"^workload.script: None cannot be written"):
        toml_value(None, "workload.script")


def test_changes_name_each_setting_and_the_overrides_rebuild_the_changed_config() -> None:
    source = RunConfig().as_dict()
    changed = copy.deepcopy(source)
    changed["train"]["lr"] = 0.0005
    changed["train"]["max_steps"] = 400
    changed["name"] = "fork"
    changed["launch"]["env"] = {"OMP_NUM_THREADS": "1"}
    changes = config_changes(source, changed)
    assert [(key, new) for key, _, new in changes] == [  # in the config's order
        ("name", "fork"), ("launch.env", {"OMP_NUM_THREADS": "1"}), ("train.max_steps", 400), ("train.lr", 0.0005)]
    assert apply_overrides(source, overrides_for(source, changed)) == changed
    assert config_changes(source, copy.deepcopy(source)) == [] and overrides_for(source, source) == []
