"""Every field of the run config is either held to the UI's roots or inert, and each rule holds.

The table (orchestrator/scripts/ui_fields.py: GUARDED_FIELDS, INERT_FIELDS) is checked against a
walk of RunConfig, so a new field that names something to run or read cannot arrive without a
rule. Then, per guarded field, the UI's ``validate`` refuses a value outside the roots and
accepts one inside; the reported ``workload.module`` attacks go through the New run page's
functions (app.data.validate_config, submit_run, fork_run) on a real SQLite database and queue
nothing; the CLI keeps full freedom. Real files in tmp_path, real interpreters for the probe;
nothing is mocked.

    pytest tests/unit/orchestrator/scripts/test_ui_fields.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
import streamlit as st
from click.testing import CliRunner
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

import app.data as ui
from db.models import Checkpoint
from db.queries import run_detail
from db.requests import create_run
from db.run_list import list_runs
from db.vocabulary.config import WORKLOADS, ConfigError, RunConfig, ScriptWorkload, field_of, parse_config
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from orchestrator.executors.launcher import script_entry
from orchestrator.scripts.allowed_roots import LAUNCH_FIELDS, ROOTS_ENV, script_roots
from orchestrator.scripts.ui_fields import GUARDED_FIELDS, INERT_FIELDS
from orchestrator.submission import validate
from orchestrator.sweeps.submission import validate_sweep
from tests.unit.orchestrator.scripts.script_files import CPU2, script_at

# The reported attacks: each runs a shell command through a module of the standard library or torch.
ATTACKS: dict[str, list[str]] = {
    "timeit": ["-n", "1", "-s", "import os; os.system('id > /tmp/x')", "pass"],
    "torch.distributed.run": ["--no-python", "/bin/sh", "-c", "id > /tmp/x"],
    "runpy": ["/tmp/outside/evil.py"],
    "pdb": ["/tmp/outside/evil.py"],
}


def config_fields(model: type[BaseModel] = RunConfig, prefix: str = "") -> set[str]:
    """Every leaf field of ``model`` as "section.key" (TOML keys), through nested sections."""
    found: set[str] = set()
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        sections = [t for t in (info.annotation, *get_args(info.annotation))
                    if isinstance(t, type) and issubclass(t, BaseModel)]
        for section in sections:
            found |= config_fields(section, key + ".")
        if not sections:
            found.add(key)
    return found


def unclassified(model: type[BaseModel] = RunConfig) -> set[str]:
    return config_fields(model) - GUARDED_FIELDS.keys() - INERT_FIELDS.keys()


# -- the table ---------------------------------------------------------------------------------


def test_every_field_of_the_run_config_is_guarded_or_inert() -> None:
    missing = unclassified()
    assert not missing, (f"{sorted(missing)}: new run config fields; put each in GUARDED_FIELDS (with the rule "
                         "the UI applies, and a case below) or INERT_FIELDS (with why it names nothing to run or "
                         "read) in orchestrator/scripts/allowed_roots.py")
    assert not GUARDED_FIELDS.keys() & INERT_FIELDS.keys()
    assert GUARDED_FIELDS.keys() | INERT_FIELDS.keys() == config_fields(), "a listed field the config no longer has"
    # Every kind's fields are in its model of the WorkloadConfig union, which the walk covers whole.
    assert {f"workload.{name}" for model in WORKLOADS for name in model.model_fields} <= config_fields()
    # A fork from the UI that changes a guarded field is judged again.
    assert set(GUARDED_FIELDS) <= set(LAUNCH_FIELDS)


def test_a_new_field_in_neither_list_fails_the_walk() -> None:
    """What the first test does when someone adds, say, a pip index to the workload."""

    class NewWorkload(ScriptWorkload):
        pip_index_url: str | None = None

    class NewConfig(RunConfig):
        workload: NewWorkload = NewWorkload(script="train.py")

    assert unclassified(NewConfig) == {"workload.pip_index_url"}


# -- each guarded field: refused outside, accepted inside, through the UI's validate -----------


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """The folder the UI started in (a root, holding a module, a package and a script), the data
    folder (a root) and a folder outside both with the same files."""
    folders = {name: tmp_path / name for name in ("project", "home", "outside")}
    for folder in folders.values():
        script_at(folder / "train.py")
        script_at(folder / "mytrain.py")
        script_at(folder / "pkg" / "__init__.py")
        script_at(folder / "pkg" / "train.py")
        (folder / "corpus.txt").write_text("hello world " * 200)
    return folders


def problems(data: dict[str, Any], layout: dict[str, Path], environ: dict[str, str] | None = None,
             cwd: str = "project") -> list[str]:
    """What the UI's validate says about ``data``: the UI's roots, started in ``layout[cwd]``."""
    roots = script_roots(environ or {}, layout[cwd], layout["home"])
    here = os.getcwd()
    os.chdir(layout[cwd])
    try:
        (validate_sweep if "sweep" in data else validate)(data, CPU2, roots=roots)
    except ConfigError as exc:
        return exc.problems
    finally:
        os.chdir(here)
    return []


def script(**workload: Any) -> dict[str, Any]:
    return {"workload": {"kind": "script", **workload}, "launch": {"nproc_per_node": 1}}


def sweep_of(key: str, *choices: Any) -> dict[str, Any]:
    """A sweep of a script whose space gives ``key`` each of ``choices``."""
    return {**script(script="train.py"), "sweep": {"metric": "loss", "space": {key: {"choice": list(choices)}}}}


def torchrun_in(folder: Path) -> Path:
    """An executable beside a virtual environment's python: not an interpreter."""
    path = folder / ".venv" / "bin" / "torchrun"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\nexec \"$@\"\n")
    path.chmod(0o755)
    return path


# field -> (outside value's config, inside value's config), given the layout
CASES: dict[str, Callable[[dict[str, Path]], tuple[dict[str, Any], dict[str, Any]]]] = {
    "workload.script": lambda d: (script(script=str(d["outside"] / "train.py")), script(script="train.py")),
    "workload.module": lambda d: (script(module="timeit", args=ATTACKS["timeit"]), script(module="pkg.train")),
    "workload.workdir": lambda d: (script(module="mytrain", workdir=str(d["outside"])),
                                   script(module="mytrain", workdir=str(d["home"]))),
    "workload.python": lambda d: (script(script="train.py", python=str(torchrun_in(d["outside"]))),
                                  script(script="train.py", python=sys.executable)),
    "workload.text": lambda d: ({"workload": {"kind": "gpt-char", "text": str(d["outside"] / "corpus.txt")}},
                                {"workload": {"kind": "gpt-char", "text": str(d["home"] / "corpus.txt")}}),
    "workload.env": lambda d: (script(script="train.py", env={"LD_PRELOAD": str(d["outside"] / "x.so")}),
                               script(script="train.py", env={"OMP_NUM_THREADS": "2"})),
    "workload.tensorboard_dir": lambda d: (script(script="train.py", tensorboard_dir=str(d["outside"])),
                                           script(script="train.py", tensorboard_dir="runs")),
    "workload.checkpoint_glob": lambda d: (script(script="train.py", checkpoint_glob="../outside/*.pt"),
                                           script(script="train.py", checkpoint_glob="out/*.pt")),
    "slurm.sbatch_args": lambda d: (
        {"launch": {"executor": "slurm"}, "slurm": {"sbatch_args": [f"--container={d['outside']}"]}},
        {"launch": {"executor": "slurm"}, "slurm": {"sbatch_args": ["--qos=high", "--exclusive"]}}),
    # A sweep from the New sweep page: a choice of a guarded field takes that field's rule.
    "sweep.space.choice": lambda d: (sweep_of("workload.script", "train.py", str(d["outside"] / "train.py")),
                                     sweep_of("workload.script", "train.py", "mytrain.py")),
}


def test_every_guarded_field_has_a_case() -> None:
    assert CASES.keys() == GUARDED_FIELDS.keys()


@pytest.mark.parametrize("field", sorted(GUARDED_FIELDS))
def test_the_ui_refuses_a_value_outside_and_accepts_one_inside(field: str, layout: dict[str, Path]) -> None:
    outside, inside = CASES[field](layout)
    # workload.python's inside case is runyard's own interpreter: a root that holds it.
    environ = ({ROOTS_ENV: os.pathsep.join([str(layout["project"]), str(layout["home"]), sys.prefix])}
               if field == "workload.python" else {})
    refused = problems(outside, layout, environ)
    assert refused, f"{field}: {outside} was accepted from the UI"
    assert any(field in p for p in refused), refused  # the field is named
    way_out = ("`runyard submit`", "`runyard sweep start`", "workdir")
    assert all(any(w in p for w in way_out) for p in refused), refused  # the way out is named
    assert problems(inside, layout, environ) == []


# -- workload.module in detail ------------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(ATTACKS))
def test_each_reported_module_attack_is_refused_naming_the_module(module: str, layout: dict[str, Path]) -> None:
    (problem,) = problems(script(module=module, args=ATTACKS[module]), layout)
    assert problem.startswith(f"workload.module = {module!r}: ")
    assert "refused even under" in problem or "built into the interpreter" in problem
    assert "`runyard submit`" in problem


def test_a_workdir_file_that_shadows_a_library_module_is_refused(layout: dict[str, Path]) -> None:
    """A module the interpreter provides too may be loaded from there (runpy is frozen in, and
    what the runner imported before the script wins), so a same-named file in workdir is no pass."""
    for name in ("timeit", "runpy"):
        script_at(layout["project"] / f"{name}.py")
        (problem,) = problems(script(module=name, args=["-c", "pass"]), layout)
        assert problem.startswith(f"workload.module = {name!r}: "), problem


def test_a_package_is_judged_by_its_init_and_main_too(layout: dict[str, Path]) -> None:
    app = script_at(layout["project"] / "app_pkg" / "__init__.py").parent
    (app / "__main__.py").symlink_to(layout["outside"] / "train.py")
    (problem,) = problems(script(module="app_pkg"), layout)
    assert f"found at {app / '__main__.py'} resolves to {(layout['outside'] / 'train.py').resolve()} is outside" \
        in problem
    (app / "__main__.py").unlink()
    script_at(app / "__main__.py")
    assert problems(script(module="app_pkg"), layout) == []


def test_a_module_without_workdir_runs_where_the_ui_started_which_must_be_a_root(layout: dict[str, Path]) -> None:
    environ = {ROOTS_ENV: str(layout["home"])}
    (problem,) = problems(script(module="mytrain"), layout, environ, cwd="outside")
    assert field_of(problem) == "workload.workdir" and "is outside" in problem
    assert problems(script(module="mytrain"), layout, environ, cwd="home") == []


def test_a_program_beside_the_interpreter_under_a_root_is_not_an_interpreter(layout: dict[str, Path]) -> None:
    """A virtual environment's bin/ under a root also holds programs that run what their
    arguments name; the UI's workload.python must resolve to an interpreter."""
    torchrun = torchrun_in(layout["project"])
    (problem,) = problems(script(script="train.py", python=str(torchrun)), layout)
    assert problem.startswith(f"workload.python = {str(torchrun)!r}: ") and "not a Python interpreter" in problem


def test_arguments_follow_the_target_and_never_reach_python() -> None:
    """workload.args is inert: in the ranks' argv it comes after the script or module, so `-c`
    or `-m` there is the target's argument, not the interpreter's."""
    for python in (None, "/p/venv/bin/python"):
        config = parse_config(script(module="mytrain", args=["-c", "import os", "-m", "timeit"], workdir="/w",
                                     python=python))
        argv = script_entry(config)
        target = argv.index("mytrain")
        assert argv[target - 1] == "-m" and argv[target + 1:] == ["-c", "import os", "-m", "timeit"]


# -- the New run page and Fork… ------------------------------------------------------------------


@pytest.fixture
def app_home(settings: Settings, layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """The UI's functions started in the project folder, with the default roots, on a fresh database."""
    monkeypatch.chdir(layout["project"])
    monkeypatch.delenv(ROOTS_ENV, raising=False)
    monkeypatch.setenv("RUNYARD_CPU_SLOTS", "2")
    st.cache_resource.clear()
    st.cache_data.clear()
    yield settings
    st.cache_resource.clear()
    st.cache_data.clear()


def test_the_new_run_page_queues_no_module_attack_and_queues_a_module_under_the_roots(
        app_home: Settings, sessions: sessionmaker[Session]) -> None:
    for module, args in ATTACKS.items():
        with pytest.raises(ConfigError) as info:
            ui.submit_run(ui.validate_config(script(module=module, args=args)))
        assert any(p.startswith(f"workload.module = {module!r}") for p in info.value.problems), info.value.problems
    with sessions() as s:
        assert list_runs(s) == []
    run_id = ui.submit_run(ui.validate_config(script(module="pkg.train", args=["--fast"])))
    with sessions() as s:
        assert [r["id"] for r in list_runs(s)] == [run_id]
        assert run_detail(s, run_id)["config"]["workload"]["module"] == "pkg.train"


def test_a_ui_fork_to_a_library_module_is_refused(app_home: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:  # a module run accepted earlier, with a verified checkpoint at step 10
        run = create_run(s, validate(script(module="mytrain"), CPU2), app_home.runs_dir,
                         Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.add(Checkpoint(run_id=run.id, attempt=1, step=10, path="/c/step-10", bytes=1, sha256="0",
                         params_digest="0", blocked_s=0.1, total_s=0.2, created_at=time.time()))
        s.commit()
        parent = run.id
    with pytest.raises(ConfigError) as info:
        ui.fork_run(parent, 10, ['workload.module="timeit"', f"workload.args={json.dumps(ATTACKS['timeit'])}"])
    assert any(p.startswith("workload.module = 'timeit'") for p in info.value.problems), info.value.problems
    with sessions() as s:
        assert [r["id"] for r in list_runs(s)] == [parent]
    child = ui.fork_run(parent, 10, ['workload.module="pkg.train"'])
    with sessions() as s:
        assert run_detail(s, child)["config"]["workload"]["module"] == "pkg.train"


# -- the CLI keeps full freedom ------------------------------------------------------------------


def test_cli_submit_accepts_a_library_module(settings: Settings, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path / "nowhere"))
    config = tmp_path / "run.toml"
    config.write_text('[workload]\nkind = "script"\nmodule = "timeit"\nargs = ["pass"]\n[launch]\nnproc_per_node = 1\n')
    result = CliRunner().invoke(cli, ["submit", str(config), "--json"])
    assert result.exit_code == 0, result.stderr
    written = json.loads(settings.run_dir(json.loads(result.stdout)["id"]).joinpath("config.json").read_text())
    assert written["workload"]["module"] == "timeit"
