"""Starting a sweep: its file checked on this machine, then a RUNNING sweep written.

A sweep file is a run config plus ``[sweep]``. The base (the file without it) takes the path of
`runyard submit` (orchestrator/submission.py: the schema, this machine, the script's paths and
interpreter, resolved); the section takes the config model's checks, then those against the base:
every key of the space a setting of the base that takes the dimension's values
(orchestrator/sweeps/space.py), rungs the early stop and the checkpoint cadence can give
(orchestrator/sweeps/asha.py), a metric the workload records (orchestrator/sweeps/objective.py).
From the UI, each choice of a key that sets a guarded field (a script, a module, an environment
variable: orchestrator/scripts/ui_fields.py) is judged by that field's rule, as the trial's
submit would be. Every problem at once, each naming its key; nothing is written unless there is none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from db.sweeps.requests import create_sweep
from db.vocabulary.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    lenient_config,
    parse_config,
    parse_toml,
    read_config_text,
)
from db.vocabulary.config.sweep import SweepConfig
from db.vocabulary.inventory import Inventory
from orchestrator.scripts.allowed_roots import ScriptRoots
from orchestrator.scripts.ui_fields import GUARDED_FIELDS
from orchestrator.submission import ChannelCheck, validate
from orchestrator.sweeps.asha import base_rungs, rung_problems
from orchestrator.sweeps.objective import metric_problems
from orchestrator.sweeps.space import space_problems, with_values

NOT_A_SWEEP = ("sweep: the file has no [sweep] section; a single run is queued with `runyard submit FILE` "
               "(docs/SWEEPS.md says how to write a space)")


def _section(data: Any) -> tuple[SweepConfig | None, SweepConfig | None, list[str]]:
    """The ``[sweep]`` section as the config model reads it (None when refused), the section as far
    as it can be judged (a refused one without its wrong keys, which the checks against the base
    then leave out) and the model's problems, each naming its key."""
    try:
        section = parse_config({"sweep": data}).sweep
        return section, section, []
    except ConfigError as exc:
        problems = [p for p in exc.problems if p.startswith("sweep")] or exc.problems
    try:
        judged = lenient_config({"sweep": data})
    except ConfigError:
        judged = None
    return None, judged[0].sweep if judged is not None else None, problems


def validate_sweep(data: dict[str, Any], inventory: Inventory, *, roots: ScriptRoots | None = None,
                   channels: ChannelCheck | None = None) -> RunConfig:
    """A sweep file's data checked for this machine: the base as a submit checks it (``roots``
    and ``channels`` as orchestrator.submission.validate takes them), the section, and the
    section against the base.

    Returns:
        The config with its paths resolved and its ``[sweep]``.

    Raises:
        ConfigError: every problem of the base and of the sweep, with the base's plausibility
            warnings.
    """
    if not isinstance(data, dict) or data.get("sweep") is None:
        raise ConfigError([NOT_A_SWEEP])
    base_data = {k: v for k, v in data.items() if k != "sweep"}
    base: RunConfig | None = None
    problems: list[str] = []
    warnings: list[str] = []
    try:
        base = validate(base_data, inventory, roots=roots, channels=channels)
    except ConfigError as exc:
        problems, warnings = list(exc.problems), list(exc.warnings)
    section, judged_section, more = _section(data["sweep"])
    problems += more
    judged = base if base is not None else _lenient(base_data)
    if judged is not None and judged_section is not None:  # the sweep against the base, even refused ones
        rungs = base_rungs(judged, judged_section.early_stop)
        problems += space_problems(judged, judged_section) + rung_problems(judged, judged_section.early_stop)
        problems += metric_problems(judged, judged_section, rungs)
    if roots is not None and base is not None and section is not None:
        problems += guarded_choice_problems(base_data, section, inventory, roots)
    if problems or base is None or section is None:
        raise ConfigError(problems, warnings)
    return base.model_copy(update={"sweep": section})


def guarded_choice_problems(base_data: dict[str, Any], section: SweepConfig, inventory: Inventory,
                            roots: ScriptRoots) -> list[str]:
    """From the UI: each choice of a space key that sets a guarded field (``workload.script``,
    ``workload.env.X``, ...) judged by that field's rule, as the submit of a trial with it would
    be. Ranges hold numbers, which name nothing; only a choice can name a file or a variable."""
    problems = []
    for key, d in section.space.items():
        if d.kind != "choice" or not any(key == f or key.startswith(f + ".") for f in GUARDED_FIELDS):
            continue
        for value in d.values_of("choice") or []:
            try:
                validate(with_values(base_data, {key: value}), inventory, roots=roots)
            except ConfigError as exc:
                problems += [f"sweep.space.choice of {key} = {value!r}: "
                             + p.replace("`runyard submit`", "`runyard sweep start`") for p in exc.problems]
    return problems


def _lenient(base_data: dict[str, Any]) -> RunConfig | None:
    """A refused base as far as it can be judged (each wrong key at its default, as a submit judges
    the rest of a refused config), so the sweep's problems come in the same answer; None when even
    that cannot be read."""
    try:
        judged = lenient_config(base_data)
    except ConfigError:
        return None
    return judged[0] if judged is not None else None


def read_sweep_file(path: str | Path, overrides: list[str]) -> dict[str, Any]:
    """A sweep file's data with ``--set`` overrides (``sweep.max_trials=20`` as well as ``train.lr``)."""
    return apply_overrides(parse_toml(read_config_text(path)), overrides)


def validate_sweep_file(path: str | Path, overrides: list[str], inventory: Inventory,
                        channels: ChannelCheck | None = None) -> RunConfig:
    """A sweep file checked for this machine: what `runyard sweep start` starts (:func:`validate_sweep`)."""
    return validate_sweep(read_sweep_file(path, overrides), inventory, channels=channels)


def start_sweep(sessions: sessionmaker[Session], config: RunConfig) -> int:
    """Write a RUNNING sweep of a validated ``config`` (with its ``[sweep]``) and return its id; the
    scheduler's ``sweeps`` job starts its trials."""
    assert config.sweep is not None, "validate_sweep returns a config with its [sweep]"
    with sessions() as session:
        sweep = create_sweep(session, config, base_rungs(config.base(), config.sweep.early_stop))
        session.commit()
        return sweep.id
