"""What a UI user may launch: the files a run config names must lie under allowed roots.

The web UI is a launcher: whoever reaches it can queue a run, and a run config names files
that runyard runs (``workload.script`` or ``workload.module``, with any ``workload.args``)
or reads on every rank (``workload.text``). Without a limit a UI user could run the standard
library's ``timeit`` with a shell command in its arguments, or train on ``/etc/shadow``. So a
config submitted through the UI is accepted only when each such file, resolved after symlinks,
lies under an allowed root: the folders in ``RUNYARD_SCRIPT_ROOTS`` (separated by ``os.pathsep``) when it is
set, else the folder the UI was started in and the data folder.

Some folders are refused even under a root: the Python installation that runs runyard (its
standard library, site-packages, the virtual environment), any ``site-packages`` or
``dist-packages`` folder, and runyard's own packages. Their modules include entry points that
run whatever command their arguments name (``torch.distributed.run --no-python``,
``orchestrator.executors.shim``, ``trainer.process.script_runner``), and ``runyard up`` is usually started in a
checkout that holds ``.venv/`` and runyard's code.

The CLI is the user's own shell and keeps full freedom: ``runyard submit`` never applies these
roots. Only the UI's submit paths pass them to :func:`orchestrator.submission.validate`.

Every field of the run config is listed in orchestrator/scripts/ui_fields.py, in
``GUARDED_FIELDS`` with the rule the UI applies to it (here) or in ``INERT_FIELDS`` with why it
needs none; docs/SECURITY.md lists the same, field by field.
"""

from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from db.vocabulary.config import RunConfig, ScriptWorkload, relative_path_problem
from db.vocabulary.config.writing import lookup
from db.vocabulary.settings import EnvSettings
from orchestrator.scripts.ui_fields import GUARDED_FIELDS

ROOTS_ENV = EnvSettings.variable("script_roots")

# The path-valued fields judged by :func:`refused_paths`. (workload.python is judged apart: an
# interpreter of a virtual environment is a symlink to the system's Python, see
# :func:`refused_python`; workload.module by :func:`refused_module`, on what the probe found.)
PATH_FIELDS: tuple[str, ...] = ("workload.script", "workload.text", "workload.workdir")

# Fields that decide what a run executes. A UI fork that changes none of them runs what its
# parent already ran; new arguments count, since they turn an accepted script into a new command.
LAUNCH_FIELDS: tuple[str, ...] = ("workload.kind", "workload.args", "workload.resume_args", *GUARDED_FIELDS)

# What a UI user's workload.python must resolve to: the interpreter itself.
PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")

# The sbatch options a UI submission may give: scheduling and placement that name no file or
# program. Anything else (--container, --input, --bbf, --nodefile, --export-file, --get-user-env,
# ...) needs the CLI. An allowlist, as for the environment.
UI_SBATCH_OPTIONS = frozenset({
    "--qos", "--constraint", "--prefer", "--exclusive", "--gres", "--gres-flags", "--gpus", "--gpus-per-task",
    "--gpus-per-socket", "--gpu-bind", "--gpu-freq", "--cpus-per-gpu", "--mem-per-cpu", "--mem-per-gpu",
    "--mincpus", "--nodelist", "--exclude", "--reservation", "--nice", "--priority", "--comment", "--mail-type",
    "--mail-user", "--begin", "--deadline", "--dependency", "--hold", "--licenses", "--wckey", "--switches",
    "--tmp", "--threads-per-core", "--cores-per-socket", "--sockets-per-node", "--ntasks-per-core", "--hint",
    "--distribution", "--contiguous", "--oversubscribe", "--overcommit", "--spread-job", "--use-min-nodes",
    "--time-min", "--core-spec", "--thread-spec", "--network", "--cpu-freq", "--clusters", "--cluster-constraint",
    "--tres-per-task", "--mem-bind", "--no-kill", "--immediate", "--quiet", "--verbose", "--reboot",
})

# The variables a UI submission may set for the ranks: tuning and logging knobs that load no
# code. Anything else (LD_PRELOAD, PYTHONPATH, NCCL_NET_PLUGIN, TORCHINDUCTOR_CACHE_DIR, HOME,
# PATH, ... can each make the ranks load code from elsewhere) needs the CLI. An allowlist, since
# a blocklist of the ways to load code is never complete.
UI_ENV = re.compile(
    r"^(OMP_[A-Z_]+|MKL_[A-Z_]+|OPENBLAS_NUM_THREADS|KMP_[A-Z_]+|NCCL_DEBUG(_SUBSYS)?|NCCL_ASYNC_ERROR_HANDLING"
    r"|NCCL_P2P_DISABLE|NCCL_IB_DISABLE|NCCL_SHM_DISABLE|NCCL_BLOCKING_WAIT|TORCH_NCCL_[A-Z_]+"
    r"|TORCH_DISTRIBUTED_DEBUG|TORCH_CPP_LOG_LEVEL|TORCH_SHOW_CPP_STACKTRACES|TORCH_LOGS|CUDA_LAUNCH_BLOCKING"
    r"|CUBLAS_WORKSPACE_CONFIG|PYTORCH_CUDA_ALLOC_CONF|TOKENIZERS_PARALLELISM|HF_HUB_OFFLINE|HF_DATASETS_OFFLINE"
    r"|TRANSFORMERS_OFFLINE|WANDB_MODE|WANDB_SILENT|TF_CPP_MIN_LOG_LEVEL|PYTHONHASHSEED|PYTHONWARNINGS"
    r"|RUNYARD_WANDB_SHIM)$")

# Folder names that hold installed packages, wherever they are (another project's .venv too).
PACKAGE_FOLDER_NAMES = frozenset({"site-packages", "dist-packages"})

# runyard's own top-level packages (pyproject.toml's packages.find include).
RUNYARD_PACKAGES: tuple[str, ...] = ("app", "db", "orchestrator", "trainer")


@dataclass(frozen=True)
class ScriptRoots:
    """The folders under which the files of a UI submission must lie.

    Attributes:
        allowed: Resolved folders a named file may lie under.
        excluded: Resolved folders refused even under an allowed root (the Python installation,
            runyard's own packages).
        source: How ``allowed`` was chosen, for messages: ``RUNYARD_SCRIPT_ROOTS`` or the default.
    """

    allowed: tuple[Path, ...]
    excluded: tuple[Path, ...] = ()
    source: str = ROOTS_ENV


def _resolved(path: Path) -> Path:
    """``path`` made absolute with its symlinks and ``..`` resolved; unchanged (but absolute)
    when it cannot be resolved, e.g. a symlink loop."""
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return Path(os.path.abspath(path))


def _unique(paths: Iterable[Path]) -> tuple[Path, ...]:
    return tuple(dict.fromkeys(paths))


def python_installation() -> tuple[Path, ...]:
    """The folders of the Python that runs runyard: the standard library, site-packages (the
    user's too) and, in a virtual environment, the whole environment."""
    paths = sysconfig.get_paths()
    found = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]
    found += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    found.append(site.getusersitepackages())
    if sys.prefix != sys.base_prefix:  # a virtual environment: its bin/ and lib/ alike
        found += [sys.prefix, sys.exec_prefix]
    return _unique(_resolved(Path(p)) for p in found)


def runyard_packages() -> tuple[Path, ...]:
    """The folders of runyard's own packages, wherever runyard is installed or checked out."""
    top = Path(__file__).resolve().parents[2]
    return tuple(top / name for name in RUNYARD_PACKAGES)


def script_roots(environ: Mapping[str, str], cwd: Path, home: Path) -> ScriptRoots:
    """The roots a UI process applies, read once when it starts.

    Args:
        environ: The environment; ``RUNYARD_SCRIPT_ROOTS`` (folders separated by ``os.pathsep``,
            a relative one resolved against ``cwd``) replaces the default when it names any.
        cwd: The folder the UI was started in (where ``runyard up`` ran); a default root.
        home: The data folder (``settings.home``); a default root.

    Returns:
        The allowed roots, each resolved after symlinks, and the folders always refused.
    """
    entries = [e for e in EnvSettings.from_env(environ).script_roots.split(os.pathsep) if e.strip()]
    if entries:
        allowed = _unique(_resolved(cwd / Path(e.strip()).expanduser()) for e in entries)
        source = ROOTS_ENV
    else:
        allowed = _unique((_resolved(cwd), _resolved(home)))
        source = f"the default: the folder `runyard up` was started in and the data folder; {ROOTS_ENV} replaces it"
    return ScriptRoots(allowed=allowed, excluded=python_installation() + runyard_packages(), source=source)


def _field_value(config: RunConfig, field: str) -> Any:
    """The value of a dotted key as the config's data holds it; None for a key the run's
    workload kind does not have."""
    section, key = field.split(".")
    return config.as_dict()[section].get(key)


def _roots_named(roots: ScriptRoots) -> str:
    listed = ", ".join(str(r) for r in roots.allowed) or "none"
    return f"the folders the UI may launch from: {listed} ({roots.source})"


# Both ways out: widen the roots for the UI, or use the shell, which has no roots at all.
CLI_WAY = "submit it from a shell with `runyard submit`, which has no such limit"


def _refusal(field: str, raw: str, path: Path, given: Path, roots: ScriptRoots) -> str | None:
    """Why ``path`` (``given`` resolved after symlinks) may not be named by a UI user, or None."""
    shown = f"{given} resolves to {path}" if path != given else str(path)
    head = f"{field} = {raw!r}: {shown}"
    where = next((d for d in roots.excluded if path.is_relative_to(d)), None) or next(
        (p for p in path.parents if p.name in PACKAGE_FOLDER_NAMES), None)
    if where is not None:
        return (f"{head} lies in {where}: installed Python code or runyard's own, whose modules can run "
                f"any command given as their arguments, is refused even under {_roots_named(roots)}. "
                f"To run it anyway, {CLI_WAY}")
    if not any(path.is_relative_to(root) for root in roots.allowed):
        return (f"{head} is outside {_roots_named(roots)}. To allow it, set {ROOTS_ENV} to the folders "
                f"to allow (separated by {os.pathsep!r}) before starting `runyard up`, or {CLI_WAY}")
    return None


def refused_paths(config: RunConfig, roots: ScriptRoots, base: Path) -> dict[str, str]:
    """The path fields of ``config`` that a UI user may not name, each with the reason.

    Each field in :data:`PATH_FIELDS` that is set is joined to ``base`` (a relative path is
    resolved against it, as :func:`orchestrator.scripts.script_check.resolve_script` does), resolved
    after symlinks and ``..``, and accepted only when it lies under one of ``roots.allowed``
    and under none of ``roots.excluded`` or a ``site-packages`` folder. An unset
    ``workload.workdir`` of a module run is judged as ``base``, where the module then runs. A path that does not
    exist is judged by where it would be; the submission's own checks then say it is missing.

    Args:
        config: The parsed run config, paths as the person wrote them.
        roots: What the UI allows (:func:`script_roots`).
        base: The folder relative paths are resolved against (the UI process's cwd).

    Returns:
        ``{field: problem}``; each problem names the field, the path and the allowed roots and
        says how to allow it. Empty when every path may be used.
    """
    problems: dict[str, str] = {}
    for field in PATH_FIELDS:
        raw = _field_value(config, field)
        if (raw is None and field == "workload.workdir" and isinstance(config.workload, ScriptWorkload)
                and config.workload.module is not None):
            raw = "."  # a module runs, and is searched for, in the folder the UI started in
        if raw is None:
            continue
        try:
            given = Path(os.path.abspath(base / Path(raw).expanduser()))
            path = (base / Path(raw).expanduser()).resolve(strict=False)
        except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL, an unknown ~user
            problems[field] = (f"{field} = {raw!r}: cannot resolve the path ({exc}), so it cannot be shown "
                               f"to lie under {_roots_named(roots)}; {CLI_WAY}")
            continue
        problem = _refusal(field, raw, path, given, roots)
        if problem is not None:
            problems[field] = problem
    return problems


def refused_python(config: RunConfig, roots: ScriptRoots, base: Path) -> str | None:
    """Why a UI user may not name ``workload.python``, or None. The path as given (a virtual
    environment's ``bin/python`` is a symlink to the system's interpreter) must lie under an
    allowed root, and what it resolves to must be named like an interpreter (:data:`PYTHON_NAME`):
    a virtual environment's ``bin/`` also holds programs that run whatever their arguments name
    (``torchrun``). The submission then checks that it is a Python that imports torch."""
    raw = config.workload.python if isinstance(config.workload, ScriptWorkload) else None
    if raw is None:
        return None
    given = Path(os.path.abspath(base / Path(raw).expanduser()))
    if not any(given.is_relative_to(root) for root in roots.allowed):
        return (f"workload.python = {raw!r}: {given} is outside {_roots_named(roots)}. To allow it, set "
                f"{ROOTS_ENV} to include it before starting `runyard up`, or {CLI_WAY}")
    executable = given / "bin" / "python" if given.is_dir() else given
    real = _resolved(executable)
    if not PYTHON_NAME.match(real.name):
        shown = f"{executable} resolves to {real}" if real != executable else str(executable)
        return (f"workload.python = {raw!r}: {shown}, which is not a Python interpreter (python, python3, "
                f"python3.X); from the UI the ranks' interpreter must be one, or a virtual environment's "
                f"folder. To run another program, {CLI_WAY}")
    return None


@dataclass(frozen=True)
class ModuleFound:
    """Where the ranks' interpreter could find ``workload.module`` (the submission's probe,
    which searches without importing anything).

    Attributes:
        files: Every file that could provide the module or one of its packages: each package's
            ``__init__.py``, the module's own file, a package's ``__main__.py``, from every place
            on the ranks' path (``workdir``, ``PYTHONPATH``, the interpreter's path) and every
            other finder of the interpreter (an editable install's).
        folders: The folders of namespace packages among them.
        builtin: The top-level name is built into or frozen in the interpreter, which then runs
            its own copy whatever lies in ``workdir``.
    """

    files: tuple[str, ...] = ()
    folders: tuple[str, ...] = ()
    builtin: bool = False


def refused_module(module: str, found: ModuleFound, roots: ScriptRoots) -> str | None:
    """Why a UI user may not run ``workload.module`` (as ``python -m``), or None.

    Accepted only when every file and folder that could provide it lies under the roots and
    outside the refused folders (the rule of :func:`refused_paths`), each file a ``.py``: a name
    that the standard library, site-packages or runyard's packages also provide could be loaded
    from there (a module the interpreter imported before the script starts wins over
    ``workdir``), so it is refused even when ``workdir`` holds one of that name.
    """
    field = "workload.module"
    if found.builtin:
        return (f"{field} = {module!r}: {module.split('.')[0]!r} is built into the interpreter, which runs its own "
                f"copy whatever lies in workload.workdir; from the UI a module must be a .py file under "
                f"{_roots_named(roots)}. To run it anyway, {CLI_WAY}")
    for raw in (*found.files, *found.folders):
        given = Path(os.path.abspath(raw))
        path = _resolved(given)
        problem = _refusal(field, module, path, given, roots)
        if problem is not None:
            return problem.replace(f"{field} = {module!r}: ", f"{field} = {module!r}: found at ", 1)
        if raw in found.files and not (path.suffix == ".py" and path.is_file()):
            return (f"{field} = {module!r}: found at {path}, which is not a Python source file (.py); from the UI "
                    f"a module must be one, under {_roots_named(roots)}. To run it anyway, {CLI_WAY}")
    return None


def refused_sbatch_args(config: RunConfig) -> list[str]:
    """``slurm.sbatch_args`` a UI user may not give: any but ``--option`` or ``--option=value``
    words with an option of :data:`UI_SBATCH_OPTIONS` (``--container``, ``--input``, ``--bbf``
    ... name a program or a file; a bare word would be taken for the batch script)."""
    problems = []
    for arg in config.slurm.sbatch_args:
        option = arg.split("=", 1)[0]
        if option not in UI_SBATCH_OPTIONS:
            problems.append(f"slurm.sbatch_args = {arg!r}: from the UI only scheduling options that name no file or "
                            f"program (--qos=..., --constraint=..., --exclusive, ...), each as one word with its "
                            f"value after '='; {CLI_WAY}")
    return problems


def refused_env(config: RunConfig) -> list[str]:
    """``[workload.env]`` names a UI user may not set: any but the tuning and logging knobs of
    :data:`UI_ENV` (``LD_PRELOAD``, ``PYTHONPATH``, ``NCCL_NET_PLUGIN``, ``HOME``, ... can make the
    ranks load code from elsewhere)."""
    return [f"workload.env.{name}: the UI sets only thread, logging and debugging variables (OMP_*, NCCL_DEBUG, "
            f"TORCH_LOGS, ...); {name} could make the ranks load code from elsewhere; {CLI_WAY}"
            for name in (config.workload.env if isinstance(config.workload, ScriptWorkload) else {})
            if not UI_ENV.match(name)]


def refused_tensorboard_dir(config: RunConfig) -> str | None:
    """From the UI, ``workload.tensorboard_dir`` must lie inside the working directory (which
    itself lies under the roots): an absolute folder would let the page read any event files."""
    raw = config.workload.tensorboard_dir if isinstance(config.workload, ScriptWorkload) else None
    if raw is None:
        return None
    problem = relative_path_problem("workload.tensorboard_dir", raw)
    return f"{problem}; from the UI it must lie inside the working directory, or {CLI_WAY}" if problem else None


def changes_what_runs(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether ``after`` (a config mapping) changes any of :data:`LAUNCH_FIELDS` of ``before``.

    Used for forks: a fork that keeps its parent's script, arguments and text runs nothing the
    parent had not been accepted to run.
    """
    def value(data: Mapping[str, Any], field: str) -> Any:
        _, found = lookup(data, field)  # "workload.script"; a sweep's "sweep.space.choice" (a run has none)
        return list(found) if isinstance(found, (list, tuple)) else found

    return any(value(before, f) != value(after, f) for f in LAUNCH_FIELDS)
