"""Warm ranks: torchrun's agent imports torch and the trainer once, then forks every rank from itself.

A rank started cold is a fresh interpreter: before its first step it imports torch (about 1 s
of CPU), ``torch._dynamo`` (about 1 s more, which DDP's constructor and every optimizer import
whatever the model) and runyard's trainer, each rank of the node at once, after the agent has
already imported torch for itself. With ``launch.warm_start`` (on by default) runyard's torchrun
wrapper (trainer/agent/torchrun.py, ``--warm-ranks``) imports all of that in the agent before the
rendezvous, and torchrun's process context forks each rank from the agent instead of starting
an interpreter: the rank begins where a cold one would be after its imports.

What a rank is to everybody else stays what a cold start makes of it:

- its parent is the agent, in a session of its own (torchrun's ``start_new_session``), so the
  agent's ``killpg``, the parent-death signal and the scheduler's process tree see no difference;
- ``/proc/PID/environ`` and ``/proc/PID/cmdline`` show the rank's own environment (``RANK``,
  ``LOCAL_RANK`` and the rest of torchrun's variables) and its command (``python -u -m
  trainer``): the scheduler finds and tells ranks apart by them, and ``ps`` and ``nvidia-smi``
  show them. Both files read the memory where the kernel put the process's first arguments and
  environment; the rank writes its own over the agent's there, as ``setproctitle`` does with the
  command line. Its environment is the agent's plus torchrun's variables, so the launcher gives
  the agent room for them: ``RUNYARD_WARM_ROOM``, a variable of blanks that the rank drops;
- standard output and error go to the rank's log files, every other descriptor of the agent is
  covered by ``/dev/null`` (no rank holds the agent's store socket), signal dispositions are a
  fresh interpreter's, the interpreter's streams are unbuffered as under ``-u``, and Python's
  ``random`` and numpy's global generator are seeded anew;
- it ends as ``python -m trainer`` ends (the trainer exits through
  :func:`trainer.process.lifecycle.exit_without_finalising` either way).

A rank starts cold, as torchrun would start it, when any condition fails (the agent logs which):
the entry is not the built-in trainer in this interpreter (a script runs as its own ``python``
would run it), torchrun wraps the command (NUMA binding), the room is too small, or the agent has
loaded the CUDA driver (``libcuda`` mapped): a process that has initialised CUDA cannot fork a
child that uses it. Importing torch and the trainer loads no driver; the check makes sure.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import importlib
import io
import logging
import os
import queue
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from trainer.process.lifecycle import exit_without_finalising, self_stat

logger = logging.getLogger(__name__)

# The option of trainer/agent/torchrun.py that turns warm ranks on (first, before torchrun's own).
WARM_OPTION = "--warm-ranks"
# The agent's environment carries this many blanks for the ranks' larger environment.
ROOM_VARIABLE = "RUNYARD_WARM_ROOM"
ROOM_BYTES = 4096
# The entries that may start warm: runyard's own trainer (``-m trainer``).
WARM_MODULES = ("trainer",)
# What the built-in trainer imports before its first step, imported by the agent once.
PRELOAD = (
    "torch._dynamo",  # DDP's constructor and every optimizer import it
    "torch.distributed.elastic.multiprocessing.errors",
    "db.states",
    "db.vocabulary.config",
    "db.vocabulary.settings",  # the rank's environment (pydantic-settings)
    "trainer.context",
    "trainer.datasets",
    "trainer.process.distributed",
    "trainer.faults",
    "trainer.process.lifecycle",
    "trainer.process.pdeathsig",
    "trainer.sdk",
    "trainer.techniques",
    "trainer.workloads",
    "trainer.workloads.loop",
)
# /proc/self/stat fields (counted from 1): where the first arguments and environment lie.
ARG_START_FIELD, ENV_END_FIELD = 48, 51


_forked = False  # set in a rank forked by fork_rank


def started_warm() -> bool:
    """Whether this process is a rank forked from torchrun's agent (its log says so)."""
    return _forked


def room() -> dict[str, str]:
    """The variable the launcher adds to the agent's environment so that a rank's fits."""
    return {ROOM_VARIABLE: " " * ROOM_BYTES}


def encoded_block(items: Sequence[str] | Mapping[str, str]) -> bytes:
    """What ``/proc/PID/cmdline`` (a sequence) or ``environ`` (a mapping) holds: NUL-ended words."""
    words = [f"{k}={v}" for k, v in items.items()] if isinstance(items, Mapping) else list(items)
    return b"".join(os.fsencode(w) + b"\0" for w in words)


def initial_areas() -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The address ranges of this process's first arguments and environment (``arg_start``,
    ``arg_end``; ``env_start``, ``env_end``), or None where ``/proc`` does not say (Linux 3.5+)."""
    try:
        arg_start, arg_end, env_start, env_end = self_stat(*range(ARG_START_FIELD, ENV_END_FIELD + 1))
    except (OSError, ValueError, IndexError):
        return None
    if not (0 < arg_start <= arg_end <= env_start <= env_end):
        return None
    return (arg_start, arg_end), (env_start, env_end)


def cuda_driver_loaded(maps: str | None = None) -> bool:
    """Whether this process has loaded the CUDA driver (``libcuda.so``): forking it would hand
    the child a driver it cannot use."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return True  # cannot tell: assume the worst
    return "/libcuda.so" in maps


class WarmAgent:
    """The agent's side: what it preloaded, and whether a given rank can start warm."""

    def __init__(self) -> None:
        self.preloaded = False
        self._said: set[str] = set()

    def preload(self) -> None:
        """Import what every rank would import for itself. Failures leave the ranks cold."""
        started = time.monotonic()
        try:
            for name in PRELOAD:
                importlib.import_module(name)
        except Exception:  # the ranks start cold and report the error themselves
            logger.warning("warm ranks: preloading failed, the ranks start cold", exc_info=True)
            return
        self.preloaded = True
        logger.info("warm ranks: torch and the trainer imported in %.2f s", time.monotonic() - started)

    def cold_reason(self, args: Sequence[str], env: Mapping[str, str]) -> str | None:
        """Why the rank with command ``args`` and environment ``env`` must start cold, or None."""
        if not self.preloaded:
            return "the agent did not preload torch"
        if len(args) < 4 or args[0] != sys.executable or list(args[1:3]) != ["-u", "-m"] or args[3] not in WARM_MODULES:
            return f"the entry is not runyard's trainer in this interpreter ({' '.join(map(str, args[:4]))})"
        areas = initial_areas()
        if areas is None:
            return "/proc/self/stat does not say where the environment lies"
        (arg_start, arg_end), (env_start, env_end) = areas
        if len(encoded_block(args)) > arg_end - arg_start:
            return "the rank's command line is longer than the agent's"
        if len(encoded_block(rank_environment(env))) > env_end - env_start:
            return f"the rank's environment does not fit the agent's (is {ROOM_VARIABLE} set?)"
        if cuda_driver_loaded():
            return "the agent has loaded the CUDA driver"
        return None

    def say_once(self, reason: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            logger.warning("warm ranks: starting cold: %s", reason)


def rank_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The rank's environment: torchrun's, less the agent's room."""
    return {k: v for k, v in env.items() if k != ROOM_VARIABLE}


class ForkedRank:
    """What torchrun uses of a rank started with ``subprocess.Popen`` (``pid``, ``poll``, ``wait``,
    ``returncode``; it signals the rank's session with ``killpg``), for a rank forked from the agent."""

    def __init__(self, pid: int, args: Sequence[str]):
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:
                    pid, status = self.pid, 0  # reaped elsewhere: as Popen, taken for a clean end
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return code



class Forker:
    """Forks the ranks from a thread of its own, whose stack is a few frames deep.

    A rank forked from torchrun's main thread would carry the agent's whole stack under its own
    (``run.main``, the elastic agent, its process context): its stack dumps, the evidence of a
    hang, would read as waiting in ``torch.distributed`` whatever the rank did. Forked from this
    thread, the rank's stack holds this thread's few frames and the rank's own; the thread
    becomes the child's main thread. It lives as long as the agent: the parent-death signal a
    rank arms fires when the thread that forked it exits.
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="warm-ranks", daemon=True).start()

    def fork(self, args: Sequence[str], env: Mapping[str, str], stdout: Any, stderr: Any) -> ForkedRank:
        """:func:`fork_rank` on the forking thread; its exception, if any, raised here."""
        done: queue.SimpleQueue[ForkedRank | BaseException] = queue.SimpleQueue()
        self._requests.put((args, env, stdout, stderr, done))
        result = done.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def _serve(self) -> None:
        while True:
            args, env, stdout, stderr, done = self._requests.get()
            try:
                done.put(fork_rank(args, env, stdout, stderr))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.put(exc)


def fork_rank(args: Sequence[str], env: Mapping[str, str], stdout: Any, stderr: Any) -> ForkedRank:
    """Fork the rank ``args`` (``python -u -m MODULE ARGS``) from this agent.

    ``stdout``, ``stderr``: the open log files torchrun made for the rank, or None to inherit.
    """
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        become_rank(args, env, stdout.fileno() if stdout else None, stderr.fileno() if stderr else None, ready_w)
    os.close(ready_w)
    try:
        # As Popen returns only once its child has exec'd: the rank is in its own session (the
        # agent's killpg finds it) and shows its own environment before the agent goes on.
        while os.read(ready_r, 1):
            pass
    finally:
        os.close(ready_r)
    return ForkedRank(pid, args)


def become_rank(args: Sequence[str], env: Mapping[str, str], stdout: int | None, stderr: int | None,
                ready: int) -> NoReturn:
    """The forked child: turn into ``python -u -m MODULE ARGS`` with environment ``env``; close
    ``ready`` once it looks like one from outside. Never returns: it ends as the trainer does
    (:func:`~trainer.process.lifecycle.exit_without_finalising`: exit codes, tracebacks, flushed streams),
    and nothing, not even KeyboardInterrupt, unwinds into the agent's frames below."""
    global _forked
    _forked = True
    threading.current_thread().name = "MainThread"  # the forking thread is the rank's main thread

    def run() -> int:
        os.setsid()  # torchrun starts every rank in a session of its own
        gc.freeze()  # the agent's objects are never collected here (their destructors are the agent's)
        for fd, target in ((stdout, 1), (stderr, 2)):
            if fd is not None:
                os.dup2(fd, target)
        cover_inherited_descriptors(keep=ready)
        default_signals()
        areas = initial_areas()  # cold_reason() checked that both fit
        if areas is not None:
            take_environment(rank_environment(env), areas[1])
            overwrite(areas[0], encoded_block(args))  # /proc/PID/cmdline
        os.close(ready)
        unbuffered_streams()
        fresh_random_state()
        module, rest = args[3], list(args[4:])
        sys.argv, sys.orig_argv = [module, *rest], list(args)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0  # the trainer exits by itself; a module that returns ends as the interpreter would

    try:
        exit_without_finalising(run)
    finally:
        os._exit(1)  # a KeyboardInterrupt or another BaseException: never back into the agent


def cover_inherited_descriptors(keep: int = -1) -> None:
    """Put ``/dev/null`` over every descriptor above 2 but ``keep``: the agent's sockets (its
    stores' among them) and files are no longer the rank's, and a number the agent's objects
    still hold can never come back as one of the rank's own files."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in (null, keep):
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed meanwhile
                os.dup2(null, fd, inheritable=False)
    os.close(null)


def default_signals() -> None:
    """Signal dispositions as ``exec`` and a fresh interpreter leave them: handlers installed by
    the agent back to the default, ignored signals still ignored, SIGINT raising KeyboardInterrupt."""
    signal.set_wakeup_fd(-1)
    faulthandler.disable()
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def take_environment(env: Mapping[str, str], area: tuple[int, int]) -> None:
    """Make ``env`` this process's environment, for libc and for ``/proc/PID/environ`` (whose
    memory is ``area``).

    Every variable is set anew first, so that no pointer of libc's ``environ`` is left into the
    first environment's memory, which is then overwritten (the caller checked that it fits).
    """
    os.environ.clear()
    os.environ.update(env)
    overwrite(area, encoded_block(env))


def overwrite(area: tuple[int, int], data: bytes) -> None:
    """Write ``data`` at the start of ``area`` of this process's memory and zero the rest."""
    start, end = area
    size = end - start
    if len(data) > size:
        raise ValueError(f"{len(data)} bytes do not fit in {size}")
    ctypes.memmove(start, data, len(data))
    ctypes.memset(start + len(data), 0, size - len(data))


def fresh_random_state() -> None:
    """numpy's global generator seeded anew, as in a fresh interpreter (torch imports numpy in the
    agent; every rank would otherwise draw the agent's sequence). Python's ``random`` reseeds
    itself after a fork; torch's default generator has a fixed seed either way."""
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()


def unbuffered_streams() -> None:
    """Standard output and error as ``python -u`` makes them: written through at once."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding, errors=old.errors,
                                  write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def use_warm_ranks() -> None:
    """Preload the ranks' imports in this agent and make torchrun fork its ranks from it when it
    can (see the module docstring). Called by trainer/agent/torchrun.py before ``run.main``."""
    from torch.distributed.elastic.multiprocessing import api  # noqa: PLC0415 - torch in the agent only: the launcher imports this module
    from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler  # noqa: PLC0415 - torch in the agent only: the launcher imports this module

    agent = WarmAgent()
    agent.preload()
    forker = Forker()

    class WarmSubprocessHandler(SubprocessHandler):
        def _popen(self, args: tuple[Any, ...], env: dict[str, str]) -> Any:
            reason = agent.cold_reason(args, env)
            if reason is not None:
                agent.say_once(reason)
                return super()._popen(args, env)
            return forker.fork(args, env, self._stdout, self._stderr)

    def get_subprocess_handler(entrypoint: str, args: tuple[Any, ...], env: dict[str, str], stdout: str, stderr: str,
                               local_rank_id: int, numa_options: Any = None) -> SubprocessHandler:
        return WarmSubprocessHandler(entrypoint=entrypoint, args=args, env=env, stdout=stdout, stderr=stderr,
                                     local_rank_id=local_rank_id, numa_options=numa_options)

    api.get_subprocess_handler = get_subprocess_handler
