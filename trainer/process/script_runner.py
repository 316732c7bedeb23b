"""Entry point for your own script under torchrun:
``torchrun ... -m trainer.process.script_runner [--workdir DIR] SCRIPT ARGS...`` or
``... -m trainer.process.script_runner [--workdir DIR] -m MODULE ARGS...``.

The scheduler launches a ``kind = "script"`` workload through this module instead of handing
SCRIPT to torchrun directly, so that the rank dies with torchrun's agent (trainer/process/pdeathsig.py)
whatever the script does. Then SCRIPT runs as ``python SCRIPT ARGS...`` would run it: as
``__main__``, with ``sys.argv == [SCRIPT, *ARGS]`` and the script's folder first on ``sys.path``;
a MODULE as ``python -m MODULE ARGS...`` would, with the working directory first on the path.

When the script is done (returned, ``sys.exit``, or raised: printed as ``python`` prints it,
exit code 1), the runner does what the interpreter's shutdown would do that a script relies on:
non-daemon threads joined, ``atexit`` handlers run (wandb's ``finish``, ``logging.shutdown``),
the buffered writes of files left open flushed, standard output and error flushed; then it ends
the process with ``os._exit`` and the script's exit code, without the interpreter's
finalisation, where the process group's C++ threads now and then aborted a rank whose work was
done ("terminate called without an active exception"; trainer/process/process_exit.py). torchrun sees
the exit code ``python SCRIPT`` would give, and a script that raised leaves its traceback on its
standard error, where the scheduler reads it (and its error file when it uses ``@record``).

Under another interpreter (``workload.python``) this file is started by its path, in an
environment that need not have runyard installed: it then imports nothing of runyard's but
``pdeathsig``, ``store_secret`` and ``process_exit`` (standard library only; torch where the run
has a secret), loaded from beside this file.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import runpy
import sys
from collections.abc import Callable
from types import ModuleType
from typing import NoReturn


def _sibling(name: str) -> ModuleType:
    """runyard's ``trainer.process.<name>`` (standard library only): by its package when runyard is
    importable, else by location."""
    if __package__:
        return importlib.import_module(f"trainer.process.{name}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_runyard_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


USAGE = "usage: python -m trainer.process.script_runner [--workdir DIR] SCRIPT|-m MODULE [ARGS...]"


def main(argv: list[str]) -> None:
    """Arm the parent-death signal, move into ``--workdir`` when given, then run ``argv[0]`` (or
    ``-m MODULE``) with the rest as its arguments.

    The scheduler starts torchrun (and so this runner) in the run's own folder and passes the
    script's working directory here: with the user's folder as the working directory from the
    start, ``python -m`` would put it first on the path of runyard's own processes, and a
    ``trainer.py`` or ``db.py`` of the user's would shadow runyard's packages.
    """
    if argv[:1] == ["--workdir"]:
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            sys.exit(2)
        os.chdir(argv[1])
        argv = argv[2:]
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    _sibling("pdeathsig").arm_under_agent()
    # The script's init_process_group() joins the agent's store under the attempt's secret, as
    # runyard's own trainer does (trainer/process/store_secret.py).
    _sibling("store_secret").guard_worker_store()
    if argv[0] == "-m":
        module = argv[1]
        sys.argv = [module, *argv[2:]]  # runpy puts the module's file in argv[0]
        # `python -m` puts the working directory first on the path.
        sys.path[0] = os.getcwd()
        _yield_trainer_name()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    sys.argv = [script, *argv[1:]]
    # `python SCRIPT` puts SCRIPT's folder first on the path (its sibling modules import);
    # `python -m` put the working directory there instead.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    _yield_trainer_name()
    runpy.run_path(script, run_name="__main__")


def run_and_exit(argv: list[str]) -> NoReturn:
    """:func:`main`, then the end ``python SCRIPT`` would have, short of its finalisation."""
    # Loaded before the script runs: the script may take the name ``trainer`` for its own.
    process_exit = _sibling("process_exit")
    exit_now: Callable[[int], NoReturn] = process_exit.exit_now
    code = process_exit.exit_code_of(lambda: main(argv))
    process_exit.shut_down_as_python_would()
    exit_now(code)


if __name__ == "__main__":
    run_and_exit(sys.argv[1:])
