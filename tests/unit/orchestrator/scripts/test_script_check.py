"""A script run's `[workload]` refused at submit, each problem naming the field and the value: what
the CLI refuses for everyone (orchestrator/scripts/script_check.py ``resolve_script``,
db/vocabulary/config/) and what the UI refuses besides (orchestrator/scripts/allowed_roots.py).

    pytest tests/unit/orchestrator/scripts/test_script_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from db.vocabulary.config import ConfigError
from orchestrator.scripts.allowed_roots import script_roots
from orchestrator.submission import validate
from tests.unit.orchestrator.scripts.script_files import CPU2, problems_of


def problems(workload: dict, base: Path, *, ui: bool = False, **sections: dict) -> list[str]:
    """What ``validate`` says of a script config submitted from ``base`` (the CLI; with ``ui``,
    the UI with ``base`` as its only root)."""
    data = {"workload": {"kind": "script", **workload}, "launch": {"nproc_per_node": 1}, **sections}
    return problems_of(data, script_roots({}, base, base) if ui else None, base)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("raise SystemExit('must not run at submit')\n")
    (tmp_path / "train.py").write_text("print('training')\n")
    return tmp_path


def test_a_good_script_config_passes_and_is_made_absolute(project: Path) -> None:
    assert problems({"script": "train.py", "workdir": "pkg"}, project) == []
    assert problems({"module": "pkg.train"}, project) == []  # found, not run (it would exit)


def test_a_missing_workdir(project: Path) -> None:
    (problem,) = problems({"script": "train.py", "workdir": "data/none"}, project)
    assert problem.startswith("workload.workdir = 'data/none': no such folder")
    assert str(project / "data/none") in problem


@pytest.mark.parametrize(("python", "expected"), [
    ("no/python", "workload.python = 'no/python': no such file"),
    (".", "is a folder without bin/python"),
    ("train.py", "is not an executable file"),
])
def test_a_python_that_is_not_one(project: Path, python: str, expected: str) -> None:
    (problem,) = problems({"script": "train.py", "python": python}, project)
    assert problem.startswith("workload.python = ") and expected in problem, problem


def test_a_python_without_torch(project: Path, tmp_path: Path) -> None:
    fake = project / "bin" / "python"
    fake.parent.mkdir()
    # An interpreter that runs but has no torch: Python in isolated mode without this venv's packages.
    fake.write_text(f"#!/bin/sh\nexec {sys.base_prefix}/bin/python3 -S \"$@\"\n")
    fake.chmod(0o755)
    (problem,) = problems({"script": "train.py", "python": str(project)}, project)
    assert problem.startswith(f"workload.python = {str(project)!r} ({fake}): it cannot import torch"), problem


def test_a_module_that_is_not_there(project: Path) -> None:
    (problem,) = problems({"module": "pkg.missing"}, project)
    assert problem.startswith("workload.module = 'pkg.missing': no module named 'pkg.missing'"), problem
    (problem,) = problems({"module": "train.sub"}, project)
    assert problem.startswith("workload.module = 'train.sub': train is not a package"), problem


def test_a_reserved_env_name(project: Path) -> None:
    (problem,) = problems({"script": "train.py", "env": {"MASTER_PORT": "1234"}}, project)
    assert "workload.env.MASTER_PORT = '1234'" in problem and "runyard sets this variable" in problem
    (problem,) = problems({"script": "train.py", "env": {"RUNYARD_ATTEMPT": "7"}}, project)
    assert "workload.env.RUNYARD_ATTEMPT = '7'" in problem
    assert problems({"script": "train.py", "env": {"RUNYARD_WANDB_SHIM": "1", "OMP_NUM_THREADS": "4"}}, project) == []


@pytest.mark.parametrize(("pattern", "expected"), [
    ("iter (\\d+", "is not a regular expression"),
    ("iter (?P<step>\\d+): loss", "has no named group (?P<value>...)"),
])
def test_a_bad_stdout_metrics_pattern(project: Path, pattern: str, expected: str) -> None:
    (problem,) = problems({"script": "train.py", "stdout_metrics": {"loss": pattern}}, project)
    assert problem.startswith(f"workload.stdout_metrics.loss = '{pattern}'"), problem
    assert expected in problem


def test_resume_args_without_checkpoint_glob(project: Path) -> None:
    (problem,) = problems({"script": "train.py", "resume_args": ["--init_from=resume"]}, project)
    assert "workload.resume_args = ['--init_from=resume'] needs workload.checkpoint_glob" in problem


def test_a_built_in_kind_given_a_script_key(project: Path) -> None:
    data = {"workload": {"kind": "mlp-digits", "workdir": str(project)}, "launch": {"nproc_per_node": 1}}
    with pytest.raises(ConfigError) as info:
        validate(data, CPU2)
    (problem,) = info.value.problems
    assert "workload.workdir is only for kind = 'script' (kind is 'mlp-digits')" in problem


# -- refused from the UI only ------------------------------------------------------------------


def test_ui_refuses_a_workdir_outside_the_roots(project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (problem,) = problems({"script": "train.py", "workdir": str(outside)}, project, ui=True)
    assert problem.startswith(f"workload.workdir = {str(outside)!r}") and "outside" in problem, problem
    assert problems({"script": "train.py", "workdir": str(outside)}, project) == []  # the CLI may


def test_ui_refuses_a_python_outside_the_roots(project: Path) -> None:
    (problem,) = problems({"script": "train.py", "python": sys.executable}, project, ui=True)
    assert problem.startswith(f"workload.python = {sys.executable!r}") and "is outside" in problem, problem


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH", "PYTHONSTARTUP", "NCCL_NET_PLUGIN",
                                  "TORCHINDUCTOR_CACHE_DIR", "HOME", "PATH"])
def test_ui_refuses_env_that_could_change_the_code_loaded(project: Path, name: str) -> None:
    (problem,) = problems({"script": "train.py", "env": {name: "/tmp/x"}}, project, ui=True)
    assert problem.startswith(f"workload.env.{name}: the UI sets only") and "could make the ranks load code" in problem
    assert problems({"script": "train.py", "env": {name: "/tmp/x"}}, project) == []


def test_ui_sets_thread_and_logging_variables(project: Path) -> None:
    env = {"OMP_NUM_THREADS": "4", "NCCL_DEBUG": "INFO", "TORCH_LOGS": "+dynamo", "RUNYARD_WANDB_SHIM": "1"}
    assert problems({"script": "train.py", "env": env}, project, ui=True) == []


def test_ui_reads_event_files_only_inside_the_working_directory(project: Path) -> None:
    (problem,) = problems({"script": "train.py", "tensorboard_dir": "/etc"}, project, ui=True)
    assert problem.startswith("workload.tensorboard_dir = '/etc' must be relative") and "from the UI" in problem
    assert problems({"script": "train.py", "tensorboard_dir": "runs/exp"}, project, ui=True) == []
    assert problems({"script": "train.py", "tensorboard_dir": "/etc"}, project) == []  # the CLI may
