"""The New run page's script runs (app/views/new_run.py): queued with their arguments, and held to
the allowed roots (orchestrator/scripts/allowed_roots.py): a script outside them, or the standard
library with a command in its arguments, is refused.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from db import queries, run_list
from db.vocabulary.settings import Settings
from tests.unit.app.pages import no_exception, open_page, queued_runs, refusals, sessions, settings

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module


def test_new_run_form_queues_a_script_run_with_its_arguments(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    at = open_page("views/new_run.py")
    at.selectbox(key="workload.kind").set_value("script").run()  # the script fields appear for kind = script
    at.text_input(key="workload.script").input(str(script))
    at.text_input(key="workload.args").input("--steps 5 --name 'a b'")
    at.number_input(key="retry.max_retries").set_value(1)
    next(b for b in at.button if "Start" in b.label).click().run()
    no_exception(at)
    with sessions() as s:
        (run,) = run_list.list_runs(s)
        detail = queries.run_detail(s, run["id"])
    assert detail["config"]["workload"] == {**detail["config"]["workload"], "kind": "script", "script": str(script),
                                            "args": ["--steps", "5", "--name", "a b"]}
    assert detail["config"]["retry"]["max_retries"] == 1


def start_script_run(at: AppTest, script: Path | str, args: str = "") -> AppTest:
    at.selectbox(key="workload.kind").set_value("script").run()  # the script fields appear for kind = script
    at.text_input(key="workload.script").input(str(script))
    at.text_input(key="workload.args").input(args)
    at.number_input(key="launch.nproc_per_node").set_value(1)
    return next(b for b in at.button if "Start" in b.label).click().run()


def test_new_run_refuses_a_script_outside_the_roots_then_queues_one_inside(
        settings: Settings, sessions: sessionmaker[Session], tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("elsewhere") / "train.py"  # beside the home, not in it
    outside.write_text("print('hello')\n")
    at = start_script_run(open_page("views/new_run.py"), outside)
    no_exception(at)
    (error,) = refusals(at)
    assert error.startswith(f"workload.script = {str(outside)!r}: {outside.resolve()} is outside")
    assert f"{Path.cwd().resolve()}, {settings.home}" in error  # the roots: where the UI started, the data folder
    assert "RUNYARD_SCRIPT_ROOTS" in error and "`runyard submit`" in error
    assert queued_runs(sessions) == []

    inside = settings.home / "train.py"
    inside.write_text("print('hello')\n")
    at = start_script_run(at, inside)
    no_exception(at)
    (run,) = queued_runs(sessions)
    with sessions() as s:
        assert queries.run_detail(s, run["id"])["config"]["workload"]["script"] == str(inside)


def test_new_run_refuses_the_standard_library_with_a_command_in_its_arguments(
        settings: Settings, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported attack, with a root as wide as / set: timeit.py runs its -s setup as Python."""
    monkeypatch.setenv("RUNYARD_SCRIPT_ROOTS", "/")
    timeit = Path(sysconfig.get_paths()["stdlib"]) / "timeit.py"
    at = start_script_run(open_page("views/new_run.py"), timeit, "-s 'import os; os.system(\"cat /etc/shadow\")' pass")
    no_exception(at)
    (error,) = refusals(at)
    assert error.startswith(f"workload.script = {str(timeit)!r}")
    assert "refused even under the folders the UI may launch from: / (RUNYARD_SCRIPT_ROOTS)" in error
    assert queued_runs(sessions) == []
