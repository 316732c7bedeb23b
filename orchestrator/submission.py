"""Submitting a run: validate the config against this machine, then write a QUEUED run.

Used by the CLI and the UI alike. Nothing is queued unless every check passes, and every
problem is reported at once, each naming the field and the value.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from db.config import ConfigError, LaunchConfig, RunConfig, apply_overrides, parse_config
from db.cost import price_for
from db.inventory import Inventory, check_fits
from db.models import Event, Run
from db.queries import price_table
from db.requests import RunNotFound, create_run, usable_checkpoint
from db.settings import Settings
from orchestrator.memory import check_memory
from orchestrator.script_roots import ScriptRoots, changes_what_runs, refused_paths


def validate(data: dict[str, Any], inventory: Inventory, *, roots: ScriptRoots | None = None) -> RunConfig:
    """Validate a config mapping for this machine.

    Args:
        data: The config as a mapping (parsed TOML, the UI's form).
        inventory: This machine's devices.
        roots: For a submission through the UI, the folders its files must lie under
            (:mod:`orchestrator.script_roots`); ``None`` (the CLI) applies no roots.

    Raises:
        ConfigError: with the schema, machine and path problems together.
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
    problems = check_fits(config, inventory) + check_memory(config, inventory)
    # A refused path is not looked at further: "no such file" would tell a UI user what exists
    # outside the roots.
    refused = refused_paths(config, roots, Path.cwd()) if roots is not None else {}
    problems += refused.values()
    if config.workload.kind == "script" and "workload.script" not in refused:
        config, script_problems = resolve_script(config)
        problems += script_problems
    if "workload.text" not in refused:
        config, text_problems = resolve_text(config)
        problems += text_problems
    if problems:
        raise ConfigError(problems)
    return config


# Every rank reads the whole text into memory (about 30 bytes per character once encoded).
MAX_TEXT_BYTES = 256 * 1024**2
# gpt-char keeps the last 10% of the text for validation and draws windows of block_size + 1.
VAL_FRACTION = 0.1


def _text_problem(raw: str, path: Path, block_size: int) -> str | None:
    """What makes ``path`` unusable as gpt-char's text, or ``None``."""
    field = f"workload.text = {raw!r}"
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return f"{field}: no such file ({path})"
    except OSError as exc:
        return f"{field}: cannot read it ({path}): {exc.strerror}"
    if stat.S_ISDIR(st.st_mode):
        return f"{field}: {path} is a directory; give a text file"
    if not stat.S_ISREG(st.st_mode):  # /dev/zero would be read until memory runs out; a FIFO blocks
        return f"{field}: {path} is not a regular file (a device, pipe or socket); give a text file"
    if st.st_size > MAX_TEXT_BYTES:
        return (f"{field}: {path} is {st.st_size / 1024**2:.0f} MiB; at most {MAX_TEXT_BYTES // 1024**2} MiB "
                "(every rank holds the whole text in memory)")
    if int(st.st_size * VAL_FRACTION) <= block_size + 1:  # a character is at least one byte
        return (f"{field}: {path} has {st.st_size} bytes, too short for workload.block_size = {block_size} "
                f"(the validation split, the last 10%, must be longer than block_size + 1 characters)")
    try:
        with open(path, "rb") as f:  # os.access answers yes for root where a read still fails
            f.read(1)
    except OSError as exc:
        return f"{field}: cannot read it ({path}): {exc.strerror}"
    return None


def resolve_text(config: RunConfig, base: Path | None = None) -> tuple[RunConfig, list[str]]:
    """Make ``workload.text`` an absolute path to a readable regular file of sensible size."""
    raw = config.workload.text
    if raw is None:
        return config, []
    if not raw.strip():
        return config, [f"workload.text = {raw!r}: empty path; leave the key out to train on the default text"]
    try:
        path = (Path(base or Path.cwd()) / Path(raw).expanduser()).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL character
        return config, [f"workload.text = {raw!r}: cannot resolve the path: {exc}"]
    problem = _text_problem(raw, path, config.workload.block_size)
    if problem:
        return config, [problem]
    workload = config.workload.model_copy(update={"text": str(path)})
    return config.model_copy(update={"workload": workload}), []


def resolve_script(config: RunConfig, base: Path | None = None) -> tuple[RunConfig, list[str]]:
    """Make ``workload.script`` an absolute path to an existing Python file."""
    raw = config.workload.script or ""
    path = (Path(base or Path.cwd()) / Path(raw).expanduser()).resolve()
    if not path.is_file():
        return config, [f"workload.script = {raw!r}: no such file ({path}); give a path to your training script"]
    if path.suffix != ".py":
        return config, [f"workload.script = {raw!r}: expected a Python file (.py)"]
    workload = config.workload.model_copy(update={"script": str(path)})
    return config.model_copy(update={"workload": workload}), []


def submit(sessions: sessionmaker[Session], settings: Settings, config: RunConfig, inventory: Inventory) -> int:
    """Queue a validated run and return its id.

    Raises:
        ConfigError: the config cannot run on this machine.
    """
    problems = check_fits(config, inventory)
    if problems:
        raise ConfigError(problems)
    with sessions() as session:
        price = price_for(config.launch.nproc_per_node, inventory, price_table(session))  # snapshotted on the run
        run = create_run(session, config, settings.runs_dir, price)
        session.commit()
        return run.id


def fork(
    sessions: sessionmaker[Session],
    settings: Settings,
    parent_id: int,
    step: int | None,
    overrides: list[str],
    inventory: Inventory,
    *,
    roots: ScriptRoots | None = None,
) -> int:
    """Queue a new run that starts from a checkpoint of ``parent_id`` with changed settings.

    The parent's checkpoint is pinned so that retention never deletes the fork's origin.
    With ``roots`` (a fork from the UI), a fork whose changes touch what runs (the script, its
    arguments, the text) is checked like a new UI submission; one that keeps them runs only
    what the parent was accepted to run.

    Raises:
        ConfigError: the changed config is invalid.
        RequestRefused: the checkpoint does not exist or is not verified.
    """
    with sessions() as session:
        parent = session.get(Run, parent_id)
        if parent is None:
            raise RunNotFound(f"run {parent_id} does not exist")
        checkpoint = usable_checkpoint(session, parent_id, step)
        data = json.loads(parent.config_json)
        data["name"] = f"{parent.name}-fork"[:100]
        changed = apply_overrides(data, overrides)
        config = validate(changed, inventory, roots=roots if changes_what_runs(data, changed) else None)
        price = price_for(config.launch.nproc_per_node, inventory, price_table(session))
        run = create_run(session, config, settings.runs_dir, price, parent=checkpoint)
        checkpoint.pinned = True
        session.add(Event(run_id=run.id, at=run.created_at, kind="fork",
                          message=f"forked from run {parent_id} at step {checkpoint.step}"
                          + (f" with {', '.join(overrides)}" if overrides else "")))
        session.commit()
        return run.id
