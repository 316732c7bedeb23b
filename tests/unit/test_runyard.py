"""``import runyard``: the SDK under a name that cannot clash with a script's own ``trainer.py``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_until
from tests.unit.test_imports import _graph

ROOT = Path(__file__).resolve().parents[2]

# A script that keeps its own trainer.py beside it (as minGPT does) and uses runyard's SDK.
SCRIPT = """
import sys
import trainer                      # the script's own file
assert trainer.MINE == "user", trainer
import runyard
assert runyard.Run.__module__ == "trainer.sdk" and callable(runyard.init)
assert runyard.Run.__init__.__code__.co_filename.startswith({root!r}), runyard.Run
import trainer as again             # still the script's own, after the SDK loaded
assert again.MINE == "user" and sys.modules["trainer"].MINE == "user"
print("ok")
"""

# The same with the SDK first: the user's trainer.py is imported after runyard's SDK loaded.
SCRIPT_SDK_FIRST = """
import runyard
run_class = runyard.Run
import trainer
assert trainer.MINE == "user", trainer
assert run_class.__module__ == "trainer.sdk"
print("ok")
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _script_folder(tmp_path: Path, text: str) -> Path:
    (tmp_path / "trainer.py").write_text('MINE = "user"\nclass Trainer: ...\n')
    script = tmp_path / "train.py"
    script.write_text(text.format(root=str(ROOT)))
    return script


def test_import_runyard_is_cheap_and_lazy() -> None:
    code = ("import sys, runyard; assert 'torch' not in sys.modules; "
            "run = runyard.Run; import trainer.sdk; "
            "assert run is trainer.sdk.Run and runyard.init is trainer.sdk.init; "
            "import trainer; assert trainer.Run is run; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("text", [SCRIPT, SCRIPT_SDK_FIRST], ids=["trainer-first", "runyard-first"])
@pytest.mark.parametrize("runner", ["script_runner", "python"])
def test_a_scripts_own_trainer_py_does_not_shadow_the_sdk(tmp_path: Path, text: str, runner: str) -> None:
    script = _script_folder(tmp_path, text)
    # Under runyard, ranks run `python -m trainer.process.script_runner SCRIPT` (the script's folder
    # first on sys.path); alone, `python SCRIPT` does the same.
    command = ([sys.executable, "-m", "trainer.process.script_runner", str(script)] if runner == "script_runner"
               else [sys.executable, str(script)])
    out = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_sdk_loads_every_module_it_will_ever_import_while_its_packages_hold_their_names() -> None:
    """runyard.py imports the SDK's whole closure up front (it then gives the names ``trainer``
    and ``db`` back to a script's own files), so the list must be the closure read from the
    source, function-level imports included."""
    import runyard  # noqa: PLC0415 - importing the SDK rearranges sys.modules: in this test only

    graph = _graph()
    closure: set[str] = set()
    todo = ["trainer.sdk"]
    while todo:
        module = todo.pop()
        if module not in closure:
            closure.add(module)
            todo.extend(graph.get(module, ()))
    assert set(runyard._SDK_MODULES) == closure
    assert {m.split(".")[0] for m in closure} <= set(runyard._PACKAGES)


def test_a_scripts_own_db_py_does_not_shadow_the_sdk_nor_the_sdk_it(tmp_path: Path) -> None:
    """The same for ``db``: the SDK's modules import runyard's db package, the script its db.py."""
    (tmp_path / "db.py").write_text('MINE = "user"\n')
    script = tmp_path / "train.py"
    script.write_text("import db\nassert db.MINE == 'user'\nimport runyard\nrun = runyard.Run\n"
                      "import db as again\nassert again.MINE == 'user' and again is db\n"
                      f"assert sys.modules['db.vocabulary.config'].__file__.startswith({str(ROOT)!r})\nprint('ok')\n"
                      .replace("import db\n", "import sys\nimport db\n", 1))
    out = subprocess.run([sys.executable, "-m", "trainer.process.script_runner", str(script)], cwd=ROOT, env=_env(),
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# Files of a person's project that carry the names of runyard's packages: imported in place of
# runyard's, each says so on its standard error and ends the process.
PROJECT_FILES = ("app", "db", "orchestrator", "trainer")


def _project(tmp_path: Path, names: tuple[str, ...] = PROJECT_FILES) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    for name in names:
        (project / f"{name}.py").write_text(f"import sys\nsys.exit('the project\\'s own {name}.py was imported')\n")
    return project


def _healthz(port: int) -> dict[str, object]:
    """The UI's health answer, or an empty dict while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return dict(json.loads(response.read()))
    except OSError:
        return {}


def _serve(command: list[str], project: Path, home: Path, port: int, scheduler: bool) -> list[psutil.Process]:
    """Start ``command`` (with ``--port``) in ``project``; wait for the health answer (and the
    scheduler's heartbeat); returns the processes that serve, the command's own first."""
    env = {k: v for k, v in os.environ.items() if k not in ("RUNYARD_DB_URL", "PYTHONPATH")}
    env.update(RUNYARD_HOME=str(home), RUNYARD_CPU_SLOTS="1")
    log = home.parent / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*command, "--port", str(port)], cwd=project, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: proc.poll() is not None or _healthz(port).get("scheduler_alive" if scheduler else "status"),
                   60, "no health answer")
        assert proc.poll() is None, log.read_text()
        return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except BaseException:
        proc.kill()
        raise


def _stop(family: list[psutil.Process]) -> None:
    family[0].terminate()
    _gone, alive = psutil.wait_procs(family, timeout=30)
    for p in alive:
        p.kill()


def test_runyard_up_started_in_a_project_with_runyards_module_names_serves_and_schedules(tmp_path: Path) -> None:
    """`runyard up` in a folder with app.py, db.py, orchestrator.py and trainer.py: the UI answers,
    the scheduler beats, and both still work in that folder (relative paths, the UI's default
    script root)."""
    project = _project(tmp_path)
    runyard = str(Path(sys.executable).with_name("runyard"))
    family = _serve([runyard, "up"], project, tmp_path / "home", _free_port(), scheduler=True)
    try:
        servers = family[1:]
        assert {p.cwd() for p in servers} == {str(project)}, [(p.cmdline(), p.cwd()) for p in servers]
    finally:
        _stop(family)


def test_runyard_ui_and_python_m_orchestrator_in_such_a_project_serve(tmp_path: Path) -> None:
    """`python -m orchestrator ui` (the CLI itself under -m, then the UI server it becomes): a
    project's app.py and db.py stand in for nothing. (Its orchestrator.py would be what
    `python -m orchestrator` runs; the `runyard` command has no such hole.)"""
    project = _project(tmp_path, ("app", "db", "trainer"))
    family = _serve([sys.executable, "-m", "orchestrator", "ui"], project, tmp_path / "home", _free_port(),
                    scheduler=False)
    try:
        assert family[0].cwd() == str(project)
    finally:
        _stop(family)
