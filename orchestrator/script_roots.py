"""What a UI user may launch: the files a run config names must lie under allowed roots.

The web UI is a launcher: whoever reaches it can queue a run, and a run config names files
that runyard runs (``workload.script``, with any ``workload.args``) or reads on every rank
(``workload.text``). Without a limit a UI user could run the standard library's ``timeit.py``
with a shell command in its arguments, or train on ``/etc/shadow``. So a config submitted
through the UI is accepted only when each such file, resolved after symlinks, lies under an
allowed root: the folders in ``RUNYARD_SCRIPT_ROOTS`` (separated by ``os.pathsep``) when it is
set, else the folder the UI was started in and the data folder.

Some folders are refused even under a root: the Python installation that runs runyard (its
standard library, site-packages, the virtual environment), any ``site-packages`` or
``dist-packages`` folder, and runyard's own packages. Their modules include entry points that
run whatever command their arguments name (``torch.distributed.run --no-python``,
``orchestrator.shim``, ``trainer.script_runner``), and ``runyard up`` is usually started in a
checkout that holds ``.venv/`` and runyard's code.

The CLI is the user's own shell and keeps full freedom: ``runyard submit`` never applies these
roots. Only the UI's submit paths pass them to :func:`orchestrator.submission.validate`.
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

from db.config import RunConfig, relative_path_problem

ROOTS_ENV = "RUNYARD_SCRIPT_ROOTS"

# Every run config field that names a file or folder runyard runs or reads, as "section.key"; a
# new path-valued field belongs here. (workload.python is judged apart: an interpreter of a
# virtual environment is a symlink to the system's Python, see :func:`refused_python`.)
PATH_FIELDS: tuple[str, ...] = ("workload.script", "workload.text", "workload.workdir")

# Fields that decide what a run executes. A UI fork that changes none of them runs what its
# parent already ran; new arguments count, since they turn an accepted script into a new command.
LAUNCH_FIELDS: tuple[str, ...] = (
    "workload.kind", "workload.script", "workload.module", "workload.args", "workload.resume_args",
    "workload.text", "workload.workdir", "workload.python", "workload.env", "workload.tensorboard_dir",
    "workload.checkpoint_glob",
)

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
    top = Path(__file__).resolve().parents[1]
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
    entries = [e for e in environ.get(ROOTS_ENV, "").split(os.pathsep) if e.strip()]
    if entries:
        allowed = _unique(_resolved(cwd / Path(e.strip()).expanduser()) for e in entries)
        source = ROOTS_ENV
    else:
        allowed = _unique((_resolved(cwd), _resolved(home)))
        source = f"the default: the folder `runyard up` was started in and the data folder; {ROOTS_ENV} replaces it"
    return ScriptRoots(allowed=allowed, excluded=python_installation() + runyard_packages(), source=source)


def _field_value(config: RunConfig, field: str) -> Any:
    section, key = field.split(".")
    return getattr(getattr(config, section), key)


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
    resolved against it, as :func:`orchestrator.submission.resolve_script` does), resolved
    after symlinks and ``..``, and accepted only when it lies under one of ``roots.allowed``
    and under none of ``roots.excluded`` or a ``site-packages`` folder. A path that does not
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
    allowed root; the submission then checks that it is a Python that imports torch."""
    raw = config.workload.python
    if raw is None:
        return None
    given = Path(os.path.abspath(base / Path(raw).expanduser()))
    if not any(given.is_relative_to(root) for root in roots.allowed):
        return (f"workload.python = {raw!r}: {given} is outside {_roots_named(roots)}. To allow it, set "
                f"{ROOTS_ENV} to include it before starting `runyard up`, or {CLI_WAY}")
    return None


def refused_env(config: RunConfig) -> list[str]:
    """``[workload.env]`` names a UI user may not set: any but the tuning and logging knobs of
    :data:`UI_ENV` (``LD_PRELOAD``, ``PYTHONPATH``, ``NCCL_NET_PLUGIN``, ``HOME``, ... can make the
    ranks load code from elsewhere)."""
    return [f"workload.env.{name}: the UI sets only thread, logging and debugging variables (OMP_*, NCCL_DEBUG, "
            f"TORCH_LOGS, ...); {name} could make the ranks load code from elsewhere; {CLI_WAY}"
            for name in config.workload.env if not UI_ENV.match(name)]


def refused_tensorboard_dir(config: RunConfig) -> str | None:
    """From the UI, ``workload.tensorboard_dir`` must lie inside the working directory (which
    itself lies under the roots): an absolute folder would let the page read any event files."""
    raw = config.workload.tensorboard_dir
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
        section, key = field.split(".")
        table = data.get(section)
        found = table.get(key) if isinstance(table, Mapping) else None
        return list(found) if isinstance(found, (list, tuple)) else found

    return any(value(before, f) != value(after, f) for f in LAUNCH_FIELDS)
