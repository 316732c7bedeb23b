"""The end of a process of runyard's: the exit code the interpreter would give, without the
interpreter's finalisation.

Why: finalising an interpreter that imported torch tears down the process group's C++ objects
while their threads may still be joinable, and a rank whose work is done is now and then killed
by SIGABRT on its way out ("terminate called without an active exception"); it also takes
0.1-0.3 s, 3 s under load. So runyard's own processes end with ``os._exit``
(:func:`trainer.process.lifecycle.exit_without_finalising`), and so does a user's script under
``trainer/process/script_runner.py``, after :func:`shut_down_as_python_would` did for it what the
interpreter's shutdown does that a script can rely on.

This module imports only the standard library: the script runner loads it by location under
another interpreter (``workload.python``).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

# What a file object that holds written bytes in the process's memory is: the interpreter flushes
# it when it closes the object at its end (io.BufferedRandom is no io.BufferedWriter).
_BUFFERED = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
# Py_RunMain's exit code when flushing sys.stdout or sys.stderr failed at the end.
FLUSH_FAILED_CODE = 120


def exit_code_of(main: Callable[[], int | None]) -> int:
    """Run ``main``; the exit code ``python`` would give it.

    Its return value (None: 0); a ``SystemExit``'s code (None: 0; not an int: printed to
    standard error, and 1); any other exception printed through ``sys.excepthook``, as the
    interpreter prints an uncaught one, and 1. ``KeyboardInterrupt`` goes on up: the interpreter
    ends by SIGINT then, after its usual finalisation.
    """
    try:
        return main() or 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - printed as the interpreter would, then the exit code it would give
        _print_uncaught(exc)
        return 1


def _print_uncaught(exc: BaseException) -> None:
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except Exception:  # noqa: BLE001 - a broken hook: the interpreter falls back to the default print
        print("Error in sys.excepthook:", file=sys.stderr)
        traceback.print_exc()
        print("\nOriginal exception was:", file=sys.stderr)
        traceback.print_exception(type(exc), exc, exc.__traceback__)


def flush_std_streams() -> bool:
    """Flush ``sys.stdout`` and ``sys.stderr`` (whatever they are now); False when one failed."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not getattr(stream, "closed", False):
                stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe, a full disk: the exit code says so
            ok = False
    return ok


def flush_open_files() -> int:
    """Flush every file object still open whose writes wait in a buffer of this process (a file
    the script opened and never closed); the interpreter would flush it when it closes it at its
    end. Returns how many were flushed. One that fails is reported on standard error, as the
    interpreter reports it ("Exception ignored ..."), and the others are still flushed.

    Each :class:`io.TextIOWrapper` first: it writes into its binary buffer, flushed after.
    Costs one pass over ``gc.get_objects()``: 75 ms in a Trainer script's rank (380,000 objects,
    torch and transformers imported, a quiet machine), of which the list itself 25 ms.
    """
    # By type(), not isinstance(): that reads ``__class__`` of an object that is no file, and
    # proxies answer it with their own code (torch's deprecated ``reduce_op`` warns).
    found = [obj for obj in gc.get_objects() if issubclass(type(obj), _BUFFERED)]
    found.sort(key=lambda obj: not issubclass(type(obj), io.TextIOWrapper))
    flushed = 0
    for obj in found:
        try:
            if obj.closed:
                continue
            obj.flush()
            flushed += 1
        except ValueError:
            continue  # detached or never initialised: nothing of its own to flush
        except Exception as exc:  # noqa: BLE001 - one file's failure must not lose the others
            _ignored(f"flushing {obj!r} at exit", exc)
    return flushed


def _ignored(what: str, exc: BaseException) -> None:
    with contextlib.suppress(Exception):  # standard error itself gone: nothing left to tell
        print(f"Exception ignored {what}: {type(exc).__name__}: {exc}", file=sys.stderr)


def shut_down_as_python_would() -> None:
    """What the interpreter's shutdown (``Py_FinalizeEx``, CPython 3.8-3.13) does that a
    script can rely on, in its order, short of tearing the interpreter down:

    - ``threading._shutdown()``: the functions registered with ``threading._register_atexit``
      (``concurrent.futures`` joins its workers there), then every non-daemon thread joined,
      new ones too; the main thread counts as stopped from then on, as it does while the
      interpreter exits.
    - ``atexit._run_exitfuncs()``: every ``atexit`` handler, last registered first (wandb's
      ``finish``, ``logging.shutdown``, Lightning's); one that raises is reported and the others
      still run, the exit code unchanged.
    - :func:`flush_open_files`: the buffered writes of files left open.
    """
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception as exc:  # noqa: BLE001 - the interpreter reports it and goes on
            _ignored("on threading shutdown", exc)
    atexit._run_exitfuncs()
    flush_open_files()


def exit_now(code: int) -> NoReturn:
    """Flush standard output, standard error and logging, then ``os._exit(code)``: no
    finalisation. ``code`` becomes 120 when the standard streams could not be flushed, as
    ``python``'s does."""
    if not flush_std_streams():
        code = FLUSH_FAILED_CODE
    logging.shutdown()
    os._exit(code)
