"""Submitting a run: validate the config against this machine, then write a QUEUED run.

Used by the CLI and the UI alike. Nothing is queued unless every check passes, and every
problem is reported at once, each naming the field and the value.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
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
    ScriptWorkload,
    apply_overrides,
    check_plain,
    field_of,
    kind_problems,
    lenient_config,
    parse_config,
    parse_toml,
    plausibility_warnings,
    read_config_text,
    workload_as,
)
from db.vocabulary.cost import Price, config_price
from db.vocabulary.inventory import Inventory, check_fits
from db.vocabulary.settings import Settings
from orchestrator.executors.launcher import SHIMS_DIR
from orchestrator.memory import check_memory
from orchestrator.scripts.allowed_roots import (
    ModuleFound,
    ScriptRoots,
    changes_what_runs,
    refused_env,
    refused_module,
    refused_paths,
    refused_python,
    refused_sbatch_args,
    refused_tensorboard_dir,
)
from orchestrator.scripts.log_lines import check_patterns

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
            warnings of the fields that could be judged (its ``warnings``): one answer for a submit.
    """
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


def resolve_script(config: RunConfig, base: Path | None = None, *,
                   roots: ScriptRoots | None = None) -> tuple[RunConfig, list[str]]:
    """Make a script run's paths absolute and check how it will run, before anything is queued.

    ``workload.script`` an existing Python file; ``workload.workdir`` an existing folder (default:
    ``base``, the folder ``runyard submit`` runs in; from the UI, the script's own folder);
    ``workload.python`` an interpreter that imports torch (a virtual environment's folder becomes
    its ``bin/python``); ``workload.module`` found from ``workdir`` or that interpreter's path,
    and with ``roots`` (from the UI) found nowhere outside them (:func:`refused_module`);
    ``workload.stdout_metrics`` regular expressions with ``step`` and ``value`` groups.
    """
    from_ui = roots is not None
    base = Path(base or Path.cwd())
    workload = workload_as(config.workload, ScriptWorkload)
    problems: list[str] = []
    update: dict[str, Any] = {}
    if workload.script is not None:
        raw = workload.script
        path = (base / Path(raw).expanduser()).resolve()
        if not path.is_file():
            problems.append(f"workload.script = {raw!r}: no such file ({path}); give a path to your training script")
        elif path.suffix != ".py":
            problems.append(f"workload.script = {raw!r}: expected a Python file (.py)")
        update["script"] = str(path)
    default_workdir = Path(update["script"]).parent if from_ui and "script" in update else base
    workdir = (base / Path(workload.workdir).expanduser()).resolve() if workload.workdir else default_workdir
    if not workdir.is_dir():
        problems.append(f"workload.workdir = {workload.workdir!r}: no such folder ({workdir}); the ranks run "
                        "in it, so it must exist")
    update["workdir"] = str(workdir)
    python = sys.executable
    if workload.python is not None:
        python_path, problem = _interpreter(workload.python, base)
        if problem:
            problems.append(problem)
        else:
            python = update["python"] = str(python_path)
    if not problems and (workload.python is not None or workload.module is not None):
        probe_problems, found = _probe(python, workdir, workload.module, check_torch=workload.python is not None,
                                       given=workload.python)
        problems += probe_problems
        if roots is not None and found is not None and workload.module is not None and (
                module_refused := refused_module(workload.module, found, roots)) is not None:
            problems.append(module_refused)
    problems += check_patterns(workload.stdout_metrics)
    return config.model_copy(update={"workload": workload.model_copy(update=update)}), problems


def _interpreter(raw: str, base: Path) -> tuple[Path, str | None]:
    """``workload.python`` as an executable: the path itself, or a virtual environment's ``bin/python``."""
    path = Path(os.path.abspath(base / Path(raw).expanduser()))
    if path.is_dir():
        venv_python = path / "bin" / "python"
        if not venv_python.exists():
            return path, (f"workload.python = {raw!r}: {path} is a folder without bin/python; give a Python "
                          "interpreter or a virtual environment's folder")
        path = venv_python
    if not path.exists():
        return path, f"workload.python = {raw!r}: no such file ({path})"
    if not os.access(path, os.X_OK) or path.is_dir():
        return path, f"workload.python = {raw!r}: {path} is not an executable file"
    return path, None


# Run with the ranks' interpreter at submit: is it Python with torch, and where is the module?
# It finds the module without importing (executing) anything of it: every place the ranks could
# load each part from (the first one decides for the CLI; the UI refuses a module any of whose
# places lies outside its roots), as a JSON line. -I keeps workdir and PYTHONPATH off the probe's
# own path; the ranks see them, so they are searched by hand: workdir first, as `python -m` does.
_PROBE = """
import importlib.machinery as m, json, site, sys
workdir, module, check_torch, extra = sys.argv[1], sys.argv[2], sys.argv[3] == "1", json.loads(sys.argv[4])
if check_torch:
    try:
        import torch
    except Exception as exc:
        print("torch: " + repr(exc)); sys.exit(0)
if module:
    entries = [workdir] + extra + [p for p in sys.path if isinstance(p, str) and p] + [site.getusersitepackages()]
    others = [f for f in sys.meta_path if f not in (m.BuiltinImporter, m.FrozenImporter, m.PathFinder)]
    files, folders, top = [], [], module.split(".")[0]
    builtin = top in sys.builtin_module_names or m.FrozenImporter.find_spec(top) is not None
    def specs(name, where, finders):
        found = [m.PathFinder.find_spec(name, [entry]) for entry in where]
        for finder in finders:
            try:
                found.append(finder.find_spec(name, None))
            except Exception:
                pass
        found = [s for s in found if s is not None]
        for s in found:
            if s.has_location and s.origin:
                files.append(s.origin)
            elif s.submodule_search_locations:
                folders.extend(s.submodule_search_locations)
            else:
                files.append(str(s.origin))
        return found
    def inside(found):
        return [loc for s in found for loc in (s.submodule_search_locations or [])]
    parts = module.split(".")
    found = specs(parts[0], entries, others)
    if not found:
        print("module: no module named " + repr(parts[0])); sys.exit(0)
    for i, part in enumerate(parts[1:], 1):
        if not inside(found):
            print("module: " + ".".join(parts[:i]) + " is not a package"); sys.exit(0)
        found = specs(part, inside(found), [])
        if not found:
            print("module: no module named " + repr(".".join(parts[:i + 1]))); sys.exit(0)
    if inside(found):
        specs("__main__", inside(found), [])
    print("found: " + json.dumps({"files": files, "folders": folders, "builtin": builtin}))
"""
PROBE_TIMEOUT_S = 120.0


def _search_extra(environ: Mapping[str, str]) -> list[str]:
    """Path entries the ranks have beyond their interpreter's own: ``PYTHONPATH`` of the
    environment runyard runs in, and the wandb stand-in's folder (``RUNYARD_WANDB_SHIM``)."""
    return [str(SHIMS_DIR), *(p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p)]


def _probe(python: str, workdir: Path, module: str | None, *, check_torch: bool,
           given: str | None = None) -> tuple[list[str], ModuleFound | None]:
    """Problems with the ranks' interpreter and module, found by running the interpreter once,
    and where the module could be loaded from (None without a module or when it is not found);
    ``given`` is ``workload.python`` as written (a virtual environment's folder, say)."""
    field = "workload.python" if check_torch else "workload.module"
    shown = repr(given) if given is not None and given != python else repr(python)
    where = f" ({python})" if given is not None and given != python else ""
    try:
        done = subprocess.run([python, "-I", "-c", _PROBE, str(workdir), module or "", "1" if check_torch else "0",
                               json.dumps(_search_extra(os.environ))],
                              cwd=workdir, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"workload.python = {shown}{where}: could not run it ({exc})"], None
    out = done.stdout.strip().splitlines()
    last = out[-1] if out else ""
    if done.returncode != 0 or (not out and module):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [f"{field}: {python} did not run as a Python interpreter (exit {done.returncode}: {tail})"], None
    if last.startswith("torch: "):
        return [f"workload.python = {shown}{where}: it cannot import torch ({last[7:]}); install torch in that "
                "environment, or leave workload.python out to use runyard's"], None
    if last.startswith("module: "):
        return [f"workload.module = {module!r}: {last[8:]} in workload.workdir ({workdir}) or on the path of "
                f"{python}"], None
    if module and last.startswith("found: "):
        try:
            places = json.loads(last[7:])
            return [], ModuleFound(files=tuple(map(str, places["files"])), folders=tuple(map(str, places["folders"])),
                                   builtin=bool(places["builtin"]))
        except (ValueError, KeyError, TypeError):
            pass
    if module:  # an interpreter that answered something else: where the module is stays unknown
        return [f"{field}: {python} did not say where {module!r} is (last line: {last[:200]!r})"], None
    return [], None


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
