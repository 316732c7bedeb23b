"""A run's alert rules (orchestrator/alerts/findings.py): its ``[alerts]`` section validated naming
the field, and the triggers it turns on and off.
"""

from __future__ import annotations

import pytest

from db.vocabulary.config import ConfigError, parse_config
from orchestrator.alerts.findings import rules_for


def test_run_config_alerts_are_validated_naming_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"alerts": {"on": ["finished", "nope"], "budget_usd": -1}})
    text = str(err.value)
    assert "alerts.on" in text and "'nope'" in text and "alerts.budget_usd" in text
    config = parse_config({"alerts": {"on": ["finished"], "off": ["gpu_idle"], "channels": ["2"]}})
    rules = rules_for(config, ("failed", "gpu_idle"))
    assert rules.triggers == {"failed", "finished"}
