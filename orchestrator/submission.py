"""Submitting a run: validate the config against this machine, then write a QUEUED run.

Used by the CLI and the UI alike. Nothing is queued unless every check passes, and every
problem is reported at once, each naming the field and the value.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from db.requests import create_run
from db.settings import Settings
from orchestrator.cost import price_for
from orchestrator.resources import Inventory, check_fits
from trainer.config import ConfigError, LaunchConfig, RunConfig, parse_config


def validate(data: dict[str, Any], inventory: Inventory) -> RunConfig:
    """Validate a config mapping for this machine.

    Raises:
        ConfigError: with the schema problems and the machine problems together.
    """
    try:
        config = parse_config(data)
    except ConfigError as exc:
        problems = list(exc.problems)
        launch = data.get("launch") if isinstance(data, dict) else None
        if isinstance(launch, dict):
            try:  # still say "too many ranks" when another field is wrong too
                partial = RunConfig(launch=LaunchConfig.model_validate(launch))
                problems += check_fits(partial, inventory)
            except Exception:  # noqa: BLE001 - the schema errors above already cover it
                pass
        raise ConfigError(problems) from None
    problems = check_fits(config, inventory)
    if problems:
        raise ConfigError(problems)
    return config


def submit(sessions: sessionmaker[Session], settings: Settings, config: RunConfig, inventory: Inventory) -> int:
    """Queue a validated run and return its id.

    Raises:
        ConfigError: the config cannot run on this machine.
    """
    problems = check_fits(config, inventory)
    if problems:
        raise ConfigError(problems)
    with sessions() as session:
        run = create_run(session, config, settings.runs_dir, price_for(config.launch.nproc_per_node, inventory))
        session.commit()
        return run.id
