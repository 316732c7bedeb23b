"""A script run checked at submit, before anything is queued: its script, working directory and
interpreter made absolute and checked, and the ranks' interpreter run once (the probe) to say that
it imports torch and where ``workload.module`` would be loaded from, without importing the module.
orchestrator/submission.py calls :func:`resolve_script` for every script run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from db.vocabulary.config import RunConfig, ScriptWorkload, workload_as
from orchestrator.executors.launcher import SHIMS_DIR
from orchestrator.scripts.allowed_roots import ModuleFound, ScriptRoots, refused_module
from orchestrator.scripts.log_lines import check_patterns


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
