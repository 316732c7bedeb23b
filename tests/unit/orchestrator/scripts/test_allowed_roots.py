"""What a UI user may launch (orchestrator/scripts/allowed_roots.py): scripts and text files under
allowed roots, resolved after symlinks, through the same ``validate`` the UI calls, the UI's fork
path on a real SQLite database, and the CLI, which keeps full freedom.
"""

from __future__ import annotations

import json
import os
import sysconfig
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy.orm import Session, sessionmaker

from db.models import Checkpoint
from db.queries import run_detail
from db.requests import create_run
from db.run_list import list_runs
from db.vocabulary.config import ConfigError, ScriptWorkload, field_of, parse_config
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from orchestrator.scripts.allowed_roots import ROOTS_ENV, ScriptRoots, changes_what_runs, refused_paths, script_roots
from orchestrator.submission import fork, validate
from tests.unit.orchestrator.scripts.script_files import CPU2, problems_of, script_at
from tests.unit.paths import ROOT


def script_config(script: str | Path, *args: str) -> dict:
    return {"workload": {"kind": "script", "script": str(script), "args": list(args)}, "launch": {"nproc_per_node": 1}}


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """A started-in folder, a data folder and a folder outside both, each with a script."""
    folders = {name: tmp_path / name for name in ("project", "home", "outside")}
    for folder in folders.values():
        script_at(folder / "train.py")
    return folders


def default_roots(layout: dict[str, Path]) -> ScriptRoots:
    return script_roots({}, layout["project"], layout["home"])


# -- the roots ----------------------------------------------------------------------------------


def test_default_roots_are_the_started_in_folder_and_the_data_folder(layout: dict[str, Path]) -> None:
    roots = default_roots(layout)
    assert roots.allowed == (layout["project"].resolve(), layout["home"].resolve())
    assert "default" in roots.source and ROOTS_ENV in roots.source
    for folder in ("project", "home"):
        assert refused_paths(parse_config(script_config(layout[folder] / "train.py")), roots, layout["project"]) == {}
    # A relative path is resolved against the folder the UI started in.
    assert refused_paths(parse_config(script_config("train.py")), roots, layout["project"]) == {}
    assert "workload.script" in refused_paths(parse_config(script_config(layout["outside"] / "train.py")),
                                              roots, layout["project"])


def test_env_with_two_roots_replaces_the_default(layout: dict[str, Path], tmp_path: Path) -> None:
    first, second = script_at(tmp_path / "a" / "x.py").parent, script_at(tmp_path / "b" / "y.py").parent
    environ = {ROOTS_ENV: f"{first}{os.pathsep}{os.pathsep}b"}  # an empty entry is skipped; b is relative
    roots = script_roots(environ, tmp_path, layout["home"])
    assert roots.allowed == (first.resolve(), second.resolve())
    assert roots.source == ROOTS_ENV
    for script in (first / "x.py", second / "y.py"):
        assert refused_paths(parse_config(script_config(script)), roots, tmp_path) == {}
    # The data folder is no longer a root once the variable names roots.
    refused = refused_paths(parse_config(script_config(layout["home"] / "train.py")), roots, tmp_path)
    assert f"is outside the folders the UI may launch from: {first.resolve()}, {second.resolve()} ({ROOTS_ENV})" \
        in refused["workload.script"]


def test_empty_env_means_the_default(layout: dict[str, Path]) -> None:
    roots = script_roots({ROOTS_ENV: ""}, layout["project"], layout["home"])
    assert roots.allowed == default_roots(layout).allowed


# -- what is accepted and refused ---------------------------------------------------------------


def test_a_script_inside_a_root_is_accepted_and_resolved(layout: dict[str, Path]) -> None:
    cwd = os.getcwd()
    os.chdir(layout["project"])
    try:
        config = validate(script_config("train.py"), CPU2, roots=default_roots(layout))
    finally:
        os.chdir(cwd)
    assert isinstance(config.workload, ScriptWorkload)
    assert config.workload.script == str((layout["project"] / "train.py").resolve())


def test_a_script_outside_is_refused_naming_field_path_roots_and_the_ways_out(layout: dict[str, Path]) -> None:
    outside = layout["outside"] / "train.py"
    (problem,) = problems_of(script_config(outside), default_roots(layout), layout["project"])
    assert field_of(problem) == "workload.script"
    assert problem.startswith(f"workload.script = {str(outside)!r}: {outside.resolve()} is outside")
    assert f"{layout['project'].resolve()}, {layout['home'].resolve()}" in problem
    assert f"set {ROOTS_ENV}" in problem and "`runyard submit`" in problem


def test_a_missing_file_outside_is_refused_without_saying_whether_it_exists(layout: dict[str, Path]) -> None:
    (problem,) = problems_of(script_config("/etc/no-such-dir/x.py"), default_roots(layout), layout["project"])
    assert "is outside" in problem and "no such file" not in problem


def test_dot_dot_out_of_a_root_is_refused(layout: dict[str, Path]) -> None:
    sneaky = f"{layout['project']}/../outside/train.py"
    (problem,) = problems_of(script_config(sneaky), default_roots(layout), layout["project"])
    assert field_of(problem) == "workload.script"
    assert f"{(layout['outside'] / 'train.py').resolve()} is outside" in problem


def test_a_symlink_inside_a_root_pointing_outside_is_refused(layout: dict[str, Path]) -> None:
    link = layout["project"] / "link.py"
    link.symlink_to(layout["outside"] / "train.py")
    linked_dir = layout["project"] / "scripts"
    linked_dir.symlink_to(layout["outside"], target_is_directory=True)
    roots = default_roots(layout)
    for given in (link, linked_dir / "train.py"):
        (problem,) = problems_of(script_config(given), roots, layout["project"])
        assert f"{given} resolves to {(layout['outside'] / 'train.py').resolve()} is outside" in problem
    # A symlink that stays inside the roots is fine.
    inside = layout["project"] / "inside.py"
    inside.symlink_to(layout["home"] / "train.py")
    assert problems_of(script_config(inside), roots, layout["project"]) == []


def test_a_text_file_outside_is_refused_too(layout: dict[str, Path]) -> None:
    text = layout["outside"] / "corpus.txt"
    text.write_text("hello world " * 200)
    data = {"workload": {"kind": "gpt-char", "text": str(text)}, "launch": {"nproc_per_node": 1}}
    (problem,) = problems_of(data, default_roots(layout), layout["project"])
    assert field_of(problem) == "workload.text" and "is outside" in problem
    inside = layout["home"] / "corpus.txt"
    inside.write_text("hello world " * 200)
    assert problems_of({**data, "workload": {"kind": "gpt-char", "text": str(inside)}},
                       default_roots(layout), layout["project"]) == []


def test_the_standard_library_is_refused_even_under_a_root(tmp_path: Path) -> None:
    """The reported attack: timeit.py with a command in its arguments; a root of / does not allow it."""
    roots = script_roots({ROOTS_ENV: "/"}, tmp_path, tmp_path)
    timeit = Path(sysconfig.get_paths()["stdlib"]) / "timeit.py"
    (problem,) = problems_of(script_config(timeit, "-s", "import os; os.system('cat /etc/shadow')", "pass"),
                             roots, tmp_path)
    assert field_of(problem) == "workload.script"
    assert "refused even under the folders the UI may launch from: / (RUNYARD_SCRIPT_ROOTS)" in problem
    assert "`runyard submit`" in problem


def test_installed_packages_and_runyard_itself_are_refused_under_a_root(tmp_path: Path) -> None:
    """``runyard up`` is usually started in a checkout holding .venv/ and runyard's own modules,
    which run any command their arguments name (the shim, torch.distributed.run --no-python)."""
    roots = script_roots({}, ROOT, tmp_path)
    # Another project's virtual environment under a root: its site-packages are refused by name.
    venv_script = script_at(tmp_path / ".venv" / "lib" / "python3.11" / "site-packages" / "pkg" / "run.py")
    for script in (ROOT / "orchestrator" / "shim.py", ROOT / "trainer" / "process" / "script_runner.py", venv_script):
        (problem,) = problems_of(script_config(script), roots, ROOT)
        assert "installed Python code or runyard's own" in problem, problem
    assert problems_of(script_config(ROOT / "examples" / "ddp_runyard.py"), roots, ROOT) == []


def test_unresolvable_path_is_refused(layout: dict[str, Path]) -> None:
    loop = layout["project"] / "loop.py"
    loop.symlink_to(loop)
    (problem,) = problems_of(script_config(loop), default_roots(layout), layout["project"])
    assert field_of(problem) == "workload.script"


def test_without_roots_validate_applies_none(layout: dict[str, Path]) -> None:
    config = validate(script_config(layout["outside"] / "train.py"), CPU2)
    assert isinstance(config.workload, ScriptWorkload)
    assert config.workload.script == str((layout["outside"] / "train.py").resolve())


# -- the CLI keeps full freedom ----------------------------------------------------------------


def test_cli_submit_accepts_a_script_outside_the_roots(settings: Settings, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROOTS_ENV, str(script_at(tmp_path / "allowed" / "ok.py").parent))
    outside = script_at(tmp_path / "elsewhere" / "train.py")
    config = tmp_path / "run.toml"
    config.write_text(f'[workload]\nkind = "script"\nscript = "{outside}"\n[launch]\nnproc_per_node = 1\n')
    result = CliRunner().invoke(cli, ["submit", str(config), "--json"])
    assert result.exit_code == 0, result.stderr
    run_id = json.loads(result.stdout)["id"]
    written = json.loads(settings.run_dir(run_id).joinpath("config.json").read_text())
    assert written["workload"]["script"] == str(outside.resolve())


# -- forks from the UI --------------------------------------------------------------------------


def parent_with_checkpoint(sessions: sessionmaker[Session], settings: Settings, script: Path) -> int:
    """A run of ``script`` (accepted earlier, e.g. from the CLI) with a verified checkpoint at step 10."""
    with sessions() as s:
        run = create_run(s, validate(script_config(script, "--fast"), CPU2), settings.runs_dir,
                         Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.add(Checkpoint(run_id=run.id, attempt=1, step=10, path="/c/step-10", bytes=1, sha256="0",
                         params_digest="0", blocked_s=0.1, total_s=0.2, created_at=time.time()))
        s.commit()
        return run.id


def test_ui_fork_that_changes_the_script_is_held_to_the_roots(sessions: sessionmaker[Session], settings: Settings,
                                                              layout: dict[str, Path]) -> None:
    roots = default_roots(layout)
    parent = parent_with_checkpoint(sessions, settings, layout["project"] / "train.py")
    with pytest.raises(ConfigError) as info:
        fork(sessions, settings, parent, 10, [f"workload.script={json.dumps(str(layout['outside'] / 'train.py'))}"],
             CPU2, roots=roots)
    # Judged as a new UI submission: the new script, and the parent's working directory (where
    # the CLI submitted it, outside the UI's roots here) with it.
    problems = {field_of(p): p for p in info.value.problems}
    assert sorted(problems) == ["workload.script", "workload.workdir"]
    assert all("is outside" in p for p in problems.values())
    with sessions() as s:
        assert [r["id"] for r in list_runs(s)] == [parent]


def test_ui_fork_of_an_outside_script_keeps_it_only_with_the_same_arguments(
        sessions: sessionmaker[Session], settings: Settings, layout: dict[str, Path]) -> None:
    roots = default_roots(layout)
    parent = parent_with_checkpoint(sessions, settings, layout["outside"] / "train.py")  # accepted by the CLI
    new_id = fork(sessions, settings, parent, 10, ["checkpoint.keep_last=5"], CPU2, roots=roots)
    with pytest.raises(ConfigError) as info:
        fork(sessions, settings, parent, 10, ['workload.args=["--cmd", "id"]'], CPU2, roots=roots)
    assert "is outside" in info.value.problems[0]
    with sessions() as s:
        assert sorted(r["id"] for r in list_runs(s)) == [parent, new_id]
        assert run_detail(s, new_id)["config"]["checkpoint"]["keep_last"] == 5


def test_cli_fork_refuses_a_built_in_setting_for_a_script(sessions: sessionmaker[Session], settings: Settings,
                                                          layout: dict[str, Path]) -> None:
    parent = parent_with_checkpoint(sessions, settings, layout["project"] / "train.py")
    result = CliRunner().invoke(cli, ["fork", str(parent), "--step", "10", "--set", "train.lr=0.01",
                                      "--set", "train.max_steps=5"])
    assert result.exit_code != 0 and "nothing was queued" in result.stderr
    # Both problems at once, each with the field and the value.
    assert "train.lr = 0.01 applies to the built-in workloads only; a script sets its own learning rate" \
        in result.stderr
    assert "train.max_steps = 5 applies to the built-in workloads only" in result.stderr
    with sessions() as s:
        assert [r["id"] for r in list_runs(s)] == [parent]


def test_changes_what_runs_compares_the_launch_fields() -> None:
    parent = parse_config(script_config("/p/train.py", "--fast")).as_dict()
    assert not changes_what_runs(parent, {**parent, "train": {**parent["train"], "lr": 0.5}})
    assert changes_what_runs(parent, {**parent, "workload": {**parent["workload"], "args": ["--slow"]}})
    assert changes_what_runs(parent, {**parent, "workload": {**parent["workload"], "script": "/q.py"}})
