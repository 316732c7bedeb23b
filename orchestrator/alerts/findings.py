"""What an alert pass finds and what it follows: a :class:`Finding` (one per alert key), the rules
a run's alerts follow (the triggers on, the run's [alerts] thresholds, read from its stored
config), and the wording every finding shares (the run's label, a duration, an exception's line).
orchestrator/alerts/triggers.py finds them; orchestrator/alerts/engine.py turns them into alerts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from db.models import Run
from db.vocabulary.config import AlertsConfig, RunConfig


@dataclass(frozen=True)
class Finding:
    """A condition true now. ``key`` identifies its alert; ``run_id`` None for runyard itself or a
    sweep (``sweep_id``: its alert follows the sweep's base ``[alerts]`` and links to its page)."""

    key: str
    trigger: str
    run_id: int | None
    message: str
    title: str
    action: str = ""  # what the engine must do beyond telling: "pause" (a budget reached)
    ongoing: bool = True  # False: a moment (a retry began, a hang was handled): its alert closes once sent
    sweep_id: int | None = None


@dataclass(frozen=True)
class RunRules:
    """What a run's alerts follow: the triggers on, and the run's [alerts] thresholds."""

    triggers: frozenset[str]
    config: AlertsConfig


def section(run: Run, name: str) -> dict[str, Any]:
    """One section of the run's stored config, as stored (the whole config is not validated:
    that costs ~0.7 ms a run, every pass)."""
    value = json.loads(run.config_json).get(name)
    return value if isinstance(value, dict) else {}


def alerts_config(run: Run) -> AlertsConfig:
    return AlertsConfig.model_validate(section(run, "alerts"))


def rules_for(config: RunConfig | AlertsConfig, default_triggers: tuple[str, ...]) -> RunRules:
    cfg = config.alerts if isinstance(config, RunConfig) else config
    on = frozenset() if not cfg.enabled else (frozenset(default_triggers) | set(cfg.on)) - set(cfg.off)
    return RunRules(triggers=frozenset(on), config=cfg)


def run_label(run: Run) -> str:
    return f"run {run.id} ({run.name})"


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def first_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines and lines[0].startswith("Traceback") else (lines[0] if lines else "")
