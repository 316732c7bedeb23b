"""Entry point for your own script under torchrun: ``torchrun ... -m trainer.script_runner SCRIPT ARGS...``.

The scheduler launches a ``kind = "script"`` workload through this module instead of handing
SCRIPT to torchrun directly, so that the rank dies with torchrun's agent (trainer/pdeathsig.py)
whatever the script does. Then SCRIPT runs as ``python SCRIPT ARGS...`` would run it: as
``__main__``, with ``sys.argv == [SCRIPT, *ARGS]`` and the script's folder first on ``sys.path``.
"""

from __future__ import annotations

import importlib.machinery
import os
import runpy
import sys

from trainer import pdeathsig


def _yield_trainer_name() -> None:
    """Leave the name ``trainer`` to the script's own module when its path finds one.

    This runner imported runyard's ``trainer`` package, so ``import trainer`` in the script
    would get runyard's even when the script keeps its own ``trainer.py`` beside it (minGPT
    does), unlike ``python SCRIPT``. Then the name is dropped from ``sys.modules`` and the
    script's import finds its own file; runyard's SDK stays reachable as ``import runyard``
    (runyard.py loads it by location). Runyard's submodules already loaded stay as they are.
    """
    ours = sys.modules.get("trainer")
    spec = importlib.machinery.PathFinder.find_spec("trainer", sys.path)
    if ours is None or spec is None or spec.origin is None or ours.__file__ is None:
        return
    if os.path.realpath(spec.origin) != os.path.realpath(ours.__file__):
        del sys.modules["trainer"]


def main(argv: list[str]) -> None:
    """Arm the parent-death signal, then run ``argv[0]`` with ``argv[1:]`` as its arguments."""
    if not argv:
        print("usage: python -m trainer.script_runner SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(2)
    script = argv[0]
    pdeathsig.arm_under_agent()
    sys.argv = [script, *argv[1:]]
    # `python SCRIPT` puts SCRIPT's folder first on the path (its sibling modules import);
    # `python -m` put the working directory there instead.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    _yield_trainer_name()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
