"""Submitting a run: validate the config against this machine, then write a QUEUED run.

Used by the CLI and the UI alike. Nothing is queued unless every check passes, and every
problem is reported at once, each naming the field and the value.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from db.models import Event, Run
from db.queries import price_table
from db.requests import RunNotFound, create_run, pin_script_copy, usable_checkpoint
from db.vocabulary.config import (
    ConfigError,
    GptCharWorkload,
    RunConfig,
    apply_overrides,
    check_plain,
    field_of,
    kind_problems,
    lenient_config,
    parse_config,
    parse_toml,
    plausibility_warnings,
    read_config_text,
)
from db.vocabulary.cost import Price, config_price
from db.vocabulary.inventory import Inventory, check_fits
from db.vocabulary.settings import Settings
from orchestrator.memory import check_memory
from orchestrator.scripts.allowed_roots import (
    ScriptRoots,
    changes_what_runs,
    refused_env,
    refused_paths,
    refused_python,
    refused_sbatch_args,
    refused_tensorboard_dir,
)
from orchestrator.scripts.script_check import resolve_script

SWEEP_FILE = ("sweep: this file is a sweep (it has a [sweep] section): start it with `runyard sweep start FILE`; "
              "each of its trials is a run")

# What a config's ``alerts.channels`` gets wrong in a data folder: the alert channels are the
# alerts room's (``AlertStore(home).config_problems``), above this module, so the caller passes it.
ChannelCheck = Callable[[tuple[str, ...]], list[str]]


def validate(data: dict[str, Any], inventory: Inventory, *, roots: ScriptRoots | None = None,
             channels: ChannelCheck | None = None) -> RunConfig:
    """Validate a config mapping for this machine.

    Args:
        data: The config as a mapping (parsed TOML, the UI's form).
        inventory: This machine's devices.
        roots: For a submission through the UI, the folders its files must lie under
            (:mod:`orchestrator.scripts.allowed_roots`); ``None`` (the CLI) applies no roots.
        channels: What ``alerts.channels`` names that the data folder's alert channels refuse
            (``AlertStore(home).config_problems``); ``None``: not judged here.

    Raises:
        ConfigError: with the schema, machine and path problems together, and the plausibility
            warnings of the fields that could be judged (its ``warnings``): one answer for a submit;
            a sweep file (``[sweep]``) with the verb that starts one.
    """
    if isinstance(data, dict) and data.get("sweep") is not None:
        raise ConfigError([SWEEP_FILE])
    try:
        config = parse_config(data)
    except ConfigError as exc:
        raise ConfigError(*_everything_else(data, list(exc.problems), inventory, roots, channels)) from None
    config, problems = _machine_problems(config, inventory, roots, channels=channels)
    if problems:
        raise ConfigError(problems, plausibility_warnings(config))
    return config


def refusals_before_start(data: dict[str, Any], inventory: Inventory) -> list[str]:
    """What :func:`validate` would refuse that is cheap to know before Start: the schema, this
    machine's ranks and memory (no file is looked at). The New run page shows no estimate while
    there is any: it would price a run that will not start."""
    try:
        config = parse_config(data)
    except ConfigError as exc:
        return list(exc.problems)
    return check_fits(config, inventory) + check_memory(config, inventory)


def _machine_problems(config: RunConfig, inventory: Inventory, roots: ScriptRoots | None,
                      memory: bool = True, channels: ChannelCheck | None = None) -> tuple[RunConfig, list[str]]:
    """What this machine, its alert channels (``channels``) and the roots refuse in a config the
    schema accepted (``memory``: the memory check too), and the config with its script and text
    resolved."""
    problems = check_fits(config, inventory) + (check_memory(config, inventory) if memory else [])
    if channels is not None:
        problems += channels(config.alerts.channels)
    # A refused path is not looked at further: "no such file" would tell a UI user what exists
    # outside the roots.
    refused = refused_paths(config, roots, Path.cwd()) if roots is not None else {}
    if roots is not None:
        if (python_refused := refused_python(config, roots, Path.cwd())) is not None:
            refused["workload.python"] = python_refused
        problems += refused_env(config) + refused_sbatch_args(config)
        if (tb_refused := refused_tensorboard_dir(config)) is not None:
            problems.append(tb_refused)
    problems += refused.values()
    if config.workload.kind == "script" and not refused.keys() & {"workload.script", "workload.workdir",
                                                                  "workload.python"}:
        config, script_problems = resolve_script(config, roots=roots)
        problems += script_problems
    if "workload.text" not in refused:
        config, text_problems = resolve_text(config)
        problems += text_problems
    return config, problems


def _everything_else(data: dict[str, Any], problems: list[str], inventory: Inventory,
                     roots: ScriptRoots | None, channels: ChannelCheck | None) -> tuple[list[str], list[str]]:
    """The schema's ``problems`` and what else the config would be refused or warned about, in one
    answer: the paths, the roots and the machine judged on what the schema accepted
    (``db.vocabulary.config.lenient_config``: each wrong key at its default, the checks across fields
    skipped), the memory check only when no key was wrong (else it would judge a default in the
    person's place), and the plausibility warnings of the keys that were right."""
    try:
        check_plain(data)
        judged = lenient_config(data) if isinstance(data, dict) else None
    except ConfigError:  # not plain data: the schema's problems say so
        judged = None
    if judged is None:
        return problems, []
    config, dropped = judged
    config, more = _machine_problems(config, inventory, roots, memory=not dropped, channels=channels)
    more += kind_problems(config)
    warnings = [w for w in plausibility_warnings(config) if field_of(w) not in dropped]
    return problems + [p for p in more if p not in problems], warnings


# Every rank reads the whole text into memory (about 30 bytes per character once encoded).
MAX_TEXT_BYTES = 256 * 1024**2
# gpt-char keeps the last 10% of the text for validation and draws windows of block_size + 1.
VAL_FRACTION = 0.1


def validate_file(path: str | Path, overrides: list[str], inventory: Inventory,
                  channels: ChannelCheck | None = None) -> RunConfig:
    """A TOML run config file with ``--set`` overrides, validated for this machine (and its alert
    ``channels``): what `runyard submit` queues.

    Raises:
        ConfigError: the file cannot be read or parsed, or the config is refused (:func:`validate`).
    """
    return validate(apply_overrides(parse_toml(read_config_text(path)), overrides), inventory, channels=channels)


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
    workload = config.workload
    if not isinstance(workload, GptCharWorkload) or workload.text is None:
        return config, []
    raw = workload.text
    if not raw.strip():
        return config, [f"workload.text = {raw!r}: empty path; leave the key out to train on the default text"]
    try:
        path = (Path(base or Path.cwd()) / Path(raw).expanduser()).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL character
        return config, [f"workload.text = {raw!r}: cannot resolve the path: {exc}"]
    problem = _text_problem(raw, path, workload.block_size)
    if problem:
        return config, [problem]
    return config.model_copy(update={"workload": workload.model_copy(update={"text": str(path)})}), []


def run_price(config: RunConfig, inventory: Inventory, table: Mapping[str, float]) -> Price:
    """The hourly price snapshotted on a new run (db/vocabulary/cost.py's config_price)."""
    data = config.as_dict()
    return config_price(data["launch"], data["slurm"], inventory, table)


def submit(sessions: sessionmaker[Session], settings: Settings, config: RunConfig, inventory: Inventory,
           channels: ChannelCheck | None = None) -> int:
    """Queue a validated run and return its id (``channels``: judge its alert channels again, as
    they are now).

    Raises:
        ConfigError: the config cannot run on this machine, or names an alert channel refused.
    """
    problems = check_fits(config, inventory) + (channels(config.alerts.channels) if channels else [])
    if problems:
        raise ConfigError(problems)
    with sessions() as session:
        price = run_price(config, inventory, price_table(session))  # snapshotted on the run
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
    checkpoint_id: int | None = None,
    channels: ChannelCheck | None = None,
) -> int:
    """Queue a new run that starts from a checkpoint of ``parent_id`` (``checkpoint_id``, else the
    newest at ``step``, else the newest) with changed settings.

    The parent's checkpoint is pinned so that retention never deletes the fork's origin (a
    script's own checkpoint file is copied into the parent's folder, out of the script's reach).
    With ``roots`` (a fork from the UI), a fork whose changes touch what runs (the script, its
    arguments, the text) is checked like a new UI submission; one that keeps them runs only
    what the parent was accepted to run. ``channels`` judges its ``alerts.channels``
    (:func:`validate`).

    Raises:
        ConfigError: the changed config is invalid.
        RequestRefused: the checkpoint does not exist or is not verified.
    """
    with sessions() as session:
        parent = session.get(Run, parent_id)
        if parent is None:
            raise RunNotFound(f"run {parent_id} does not exist")
        checkpoint = usable_checkpoint(session, parent_id, step, checkpoint_id, verb="fork")
        data = json.loads(parent.config_json)
        data["name"] = f"{parent.name}-fork"[:100]
        changed = apply_overrides(data, overrides)
        config = validate(changed, inventory, roots=roots if changes_what_runs(data, changed) else None,
                          channels=channels)
        price = run_price(config, inventory, price_table(session))
        # The copy (gigabytes) before the first write: the write lock is not held meanwhile. A
        # failure or a crash after it leaves at most an orphan copy in the parent's folder.
        pin_script_copy(session, checkpoint)
        checkpoint.pinned = True
        run = create_run(session, config, settings.runs_dir, price, parent=checkpoint)
        session.add(Event(run_id=run.id, at=run.created_at, kind="fork",
                          message=f"forked from run {parent_id} at step {checkpoint.step}"
                          + (f" with {', '.join(overrides)}" if overrides else "")))
        session.commit()
        return run.id
