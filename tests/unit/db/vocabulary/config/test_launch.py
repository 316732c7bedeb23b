"""The ``[launch]`` section and its ``[slurm]`` (db/vocabulary/config/launch.py)."""

from __future__ import annotations

import pytest

from db.vocabulary.config import ConfigError, parse_config


def test_slurm_settings_are_refused_by_name() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"launch": {"executor": "slurm"},
                      "slurm": {"sbatch_args": ["--output=/tmp/x", "-q", "a\nb"], "time_limit": "soon"}})
    text = str(caught.value)
    assert "slurm.time_limit = 'soon'" in text and "HH:MM:SS" in text
    assert "--output is set by runyard itself" in text and "use the long form" in text and "line break" in text
    with pytest.raises(ConfigError, match=r"slurm\.partition is set but launch\.executor = 'local'"):
        parse_config({"slurm": {"partition": "gpu"}})
