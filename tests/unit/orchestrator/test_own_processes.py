"""runyard's servers start from runyard's own folder (orchestrator/own_processes.py): in a person's
project whose app.py, db.py, orchestrator.py or trainer.py carry the names of runyard's packages,
`runyard up` and `python -m orchestrator ui` still serve, in that folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.unit.orchestrator.servers import free_port, serve, stop

# Files of a person's project that carry the names of runyard's packages: imported in place of
# runyard's, each says so on its standard error and ends the process.
PROJECT_FILES = ("app", "db", "orchestrator", "trainer")


def _project(tmp_path: Path, names: tuple[str, ...] = PROJECT_FILES) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    for name in names:
        (project / f"{name}.py").write_text(f"import sys\nsys.exit('the project\\'s own {name}.py was imported')\n")
    return project


def test_runyard_up_started_in_a_project_with_runyards_module_names_serves_and_schedules(tmp_path: Path) -> None:
    """`runyard up` in a folder with app.py, db.py, orchestrator.py and trainer.py: the UI answers,
    the scheduler beats, and both still work in that folder (relative paths, the UI's default
    script root)."""
    project = _project(tmp_path)
    runyard = str(Path(sys.executable).with_name("runyard"))
    family = serve([runyard, "up"], project, tmp_path / "home", free_port(), scheduler=True)
    try:
        servers = family[1:]
        assert {p.cwd() for p in servers} == {str(project)}, [(p.cmdline(), p.cwd()) for p in servers]
    finally:
        stop(family)


def test_runyard_ui_and_python_m_orchestrator_in_such_a_project_serve(tmp_path: Path) -> None:
    """`python -m orchestrator ui` (the CLI itself under -m, then the UI server it becomes): a
    project's app.py and db.py stand in for nothing. (Its orchestrator.py would be what
    `python -m orchestrator` runs; the `runyard` command has no such hole.)"""
    project = _project(tmp_path, ("app", "db", "trainer"))
    family = serve([sys.executable, "-m", "orchestrator", "ui"], project, tmp_path / "home", free_port(),
                    scheduler=False)
    try:
        assert family[0].cwd() == str(project)
    finally:
        stop(family)
