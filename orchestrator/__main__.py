"""``python -m orchestrator`` and the ``runyard`` command (``run``, pyproject's entry point).

The CLI's modules (SQLAlchemy, pydantic, click, runyard's own) are imported with the cyclic
garbage collector off, then frozen (:func:`trainer.process.lifecycle.settle_imports` says why): about
130,000 objects that live as long as the process. A long-lived command (``runyard scheduler``,
``up``, ``ui``) thus never scans them again in its full collections either.

Under ``python -m orchestrator`` the working folder is dropped from the path first: a project's
``db.py`` or ``app.py`` must not stand in for runyard's packages (orchestrator/own_processes.py).
"""

import gc
import sys

from orchestrator.own_processes import leave_the_working_folder_out


def run() -> None:
    leave_the_working_folder_out()
    gc.disable()
    try:
        from orchestrator.cli.group import main  # noqa: PLC0415 - imported with the collector off
        from trainer.process.lifecycle import settle_imports  # noqa: PLC0415 - imported with the collector off
    except KeyboardInterrupt:  # Ctrl-C while the command was still starting: one line, as click says it later
        sys.stderr.write("Aborted!\n")
        sys.exit(130)
    settle_imports()
    main()


if __name__ == "__main__":
    run()
