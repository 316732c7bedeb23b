"""How runyard starts its own servers (the UI server, the scheduler): from runyard's own folder.

``python -m MODULE`` puts the working directory first on ``sys.path``. People start runyard from
their project (the data folder is the same from every folder), and a project's ``app.py``,
``db.py``, ``orchestrator.py`` or ``trainer.py`` was then imported in place of runyard's package of
that name: the UI server did not start (``'app' is not a package``) and the scheduler died.
Python's safe-path mode (``-P``) would leave the folder off the path, but only from Python 3.11,
and runyard supports 3.10. So a server starts in the folder that holds runyard's packages, which
Python then puts first on its path, and moves into the person's folder (``--started-in``) before
it reads anything: relative paths, the UI's default script root and the working directory of what
it starts stay what they were. A run's processes (the shim, torchrun's agent, the ranks) start in
the run's own folder instead (orchestrator/executors/launcher.py).

Standard library only: ``python -m orchestrator`` calls :func:`leave_the_working_folder_out`
before it imports anything else of runyard's.
"""

from __future__ import annotations

import os
import sys

# The folder that holds runyard's packages (app, db, orchestrator, trainer): site-packages for an
# installed runyard, the checkout for an editable one.
PACKAGES_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
STARTED_IN = "--started-in"


def server_command(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS --started-in=<this folder>``: start it with ``cwd=PACKAGES_ROOT``.

    The module's command line must accept ``--started-in`` and hand it to :func:`move_into`.
    """
    return [sys.executable, "-m", module, *args, f"{STARTED_IN}={os.getcwd()}"]


def move_into(folder: str | None) -> None:
    """Move into the folder the person started runyard in (a server's ``--started-in``), if any.

    Runyard's packages are found from the path Python built at start, whatever the working folder
    is from now on (``sys.path[0]`` is absolute under ``-m``).
    """
    if folder:
        os.chdir(folder)


def leave_the_working_folder_out() -> None:
    """Drop the working folder from the front of ``sys.path`` unless it is runyard's own.

    For ``python -m orchestrator`` typed in a project: its ``db.py`` or ``app.py`` must not stand
    in for runyard's packages in the CLI either. (A project's own ``orchestrator.py`` is what
    ``python -m orchestrator`` runs there, before any of runyard's code: the ``runyard`` command
    has no such hole.)
    """
    if not sys.path or not sys.path[0]:
        return
    first = os.path.realpath(sys.path[0])
    if first == os.path.realpath(os.getcwd()) and first != PACKAGES_ROOT:
        del sys.path[0]
