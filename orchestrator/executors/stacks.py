"""Stack dumps of a running attempt, taken off the scheduler's tick, and what they say about a
hang.

A dump asks every rank for its Python stacks: SIGUSR1 (the trainer's faulthandler appends them
to ``stacks/rank-<r>.txt``), then ``py-spy dump`` of each rank when py-spy is installed. SIGUSR1
goes only to a rank that registered runyard's faulthandler (:func:`has_stack_handler`): a plain
script never did, and SIGUSR1's default action would kill it. Such a rank gets py-spy alone, or,
without py-spy, a note in ``stacks/`` that says why its stack could not be taken. py-spy
can take seconds per process (ptrace, a large heap), so dumps run on a small thread pool
(:class:`StackDumps`, owned by the scheduler): the tick starts one and reads its result on a
later tick, and no run's supervision waits for another run's dump.

When one rank alone stopped, the dump names it (:func:`culprit`): the rank that was stopped
(state T, e.g. SIGSTOP), a rank that waits inside an exception handler while the others do not
(orchestrator/executors/stack_reading.py: it raised, and its handler waits for the others;
py-spy is asked once more, with ``--locals``, for the type of the exception it handles), or the
only rank whose stack is outside a collective while the others wait inside one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from db.vocabulary.layout import AttemptPaths
from orchestrator.executors.processes import rank_processes
from orchestrator.executors.stack_reading import (
    RankStack,
    culprit,
    exception_in_locals,
    handler_frame,
    main_thread_frames,
)

logger = logging.getLogger(__name__)

# How long the ranks get to write their faulthandler stacks after SIGUSR1.
FAULTHANDLER_WAIT_S = 2.0
# One ``py-spy dump`` may take this long; the ranks are dumped in parallel.
PY_SPY_TIMEOUT_S = 10.0

@dataclass(frozen=True)
class StackDump:
    """The result of one dump: the files in the attempt's ``stacks/`` folder and each rank's
    stacks, with the rank that alone stopped when the evidence names one."""

    folder: Path
    files: list[Path]
    ranks: list[RankStack] = field(default_factory=list)

    def culprit(self) -> tuple[int | None, str]:
        """See :func:`culprit`."""
        return culprit(self.ranks)

    def summary(self) -> str:
        """What the dump saved, for the run's event: the folder, the file count, and each rank
        whose stack could not be taken (with why)."""
        text = f"stacks saved in {self.folder} ({len(self.files)} file(s))"
        missing = [r for r in self.ranks if r.note]
        if missing:
            text += "; " + "; ".join(r.note for r in missing)
        return text


def py_spy_path() -> str | None:
    """py-spy on PATH, or beside this interpreter (installed into the same virtual environment)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else None


def _rank_of(proc: psutil.Process) -> int | None:
    try:
        env = proc.environ()
        return int(env.get("RANK", env.get("LOCAL_RANK", "")))
    except (psutil.Error, OSError, ValueError):
        return None


def _new_text(path: Path, offset: int) -> str:
    try:
        with open(path, errors="replace") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _catches_sigusr1(pid: int) -> bool | None:
    """Whether the process has a handler for SIGUSR1 (the SigCgt mask in ``/proc/<pid>/status``,
    bit ``SIGUSR1 - 1``); None where there is no /proc to read (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    except (OSError, ValueError):
        return None
    return None


def has_stack_handler(pid: int, rank: int, folder: Path) -> bool:
    """True when the rank registered runyard's faulthandler on SIGUSR1, so that SIGUSR1 writes its
    stacks instead of killing it (SIGUSR1's default action: a plain script dies of it).

    Registering (trainer/process/lifecycle.py ``register_stack_dumps``) creates ``stacks/rank-<r>.txt``;
    on Linux the process must also catch SIGUSR1 right now (``/proc``'s SigCgt), which tells a
    rank that restarted and has not registered yet from one that did, and a script's own SIGUSR1
    handler from runyard's. Without /proc the file alone decides.
    """
    if not (folder / f"rank-{rank}.txt").is_file():
        return False
    catches = _catches_sigusr1(pid)
    return catches is None or catches


def _threads(pid: int) -> dict[int, tuple[str, int]] | None:
    """Each thread of ``pid``: its state letter and the CPU it has used (user + system, in clock
    ticks), from ``/proc/<pid>/task/<tid>/stat``; None where there is no /proc to read (not
    Linux, or the process is gone)."""
    out: dict[int, tuple[str, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on: the name may hold spaces
            out[int(tid)] = (fields[0], int(fields[11]) + int(fields[12]))  # fields 3, 14 and 15 of proc(5)
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return out


def _dump_written(pid: int, since: dict[int, tuple[str, int]] | None) -> bool:
    """Whether the faulthandler dump that ``pid`` began has ended, given its threads as they were
    when its file last grew (``since``, :func:`_threads`).

    The dump is written by one thread, inside the signal's handler, in many small writes with no
    end marker; which thread runs the handler is the kernel's choice (any thread, for a signal
    that was pending while the process was stopped). A thread still inside it is runnable (state
    R: a write to a regular file does not sleep) and, whenever it gets a core, writes. So the dump
    has ended once every thread is asleep, stopped or gone, or has used CPU (two clock ticks,
    10-20 ms) since the file last grew without writing more. A file that merely holds still does
    not say so: on a loaded machine the writing thread can wait for a core for longer than the
    whole dump takes (CI 58: a stopped rank stopped again 0.1 s after its dump began, which cut
    its stacks short before the frames of its training loop)."""
    now = _threads(pid)
    if now is None or since is None:
        return True  # nothing to tell by (no /proc, or the process is gone): the file's stillness decides
    # A thread that began after the file grew is not the writer.
    return all(tid not in since or state != "R" or cpu - since[tid][1] >= 2 for tid, (state, cpu) in now.items())


def _faulthandler(procs: dict[int, psutil.Process], folder: Path) -> tuple[dict[int, bool], dict[int, str]]:
    """SIGUSR1 to every rank in ``procs`` (each registered the handler; SIGCONT after it to a
    stopped one, so it can write, and SIGSTOP again once it has); waits until each rank's dump
    began and ended (:func:`_dump_written`), at most FAULTHANDLER_WAIT_S. Returns who was stopped
    and the new text."""
    stopped: dict[int, bool] = {}
    offsets = {rank: _size(folder / f"rank-{rank}.txt") for rank in procs}
    for rank, proc in procs.items():
        try:
            stopped[rank] = proc.status() == psutil.STATUS_STOPPED
            proc.send_signal(signal.SIGUSR1)
            if stopped[rank]:
                proc.send_signal(signal.SIGCONT)
        except psutil.Error:
            stopped[rank] = False
    deadline = time.monotonic() + FAULTHANDLER_WAIT_S
    sizes = dict(offsets)
    grew: dict[int, dict[int, tuple[str, int]] | None] = {}  # each rank's threads when its file last grew
    waiting = set(procs)
    while waiting and time.monotonic() < deadline:
        time.sleep(0.05)
        for rank in sorted(waiting):
            size = _size(folder / f"rank-{rank}.txt")
            if size != sizes[rank]:
                sizes[rank], grew[rank] = size, _threads(procs[rank].pid)
            elif size != offsets[rank] and _dump_written(procs[rank].pid, grew.get(rank)):
                waiting.discard(rank)
    if waiting:
        logger.warning("the stack dump of rank(s) %s had not %s after %.0f s", sorted(waiting),
                       "ended" if any(sizes[r] != offsets[r] for r in waiting) else "begun", FAULTHANDLER_WAIT_S)
    for rank in (r for r, was in stopped.items() if was):
        # Back as it was found: the dump must not let a stopped rank train on until the kill.
        with contextlib.suppress(psutil.Error):
            procs[rank].send_signal(signal.SIGSTOP)
    return stopped, {rank: _new_text(folder / f"rank-{rank}.txt", offsets[rank]) for rank in procs}


def _py_spy(py_spy: str, procs: dict[int, psutil.Process], folder: Path,
            stopped: set[int] | frozenset[int] = frozenset(), local_variables: bool = False) -> dict[int, str]:
    """``py-spy dump`` of every rank at once, with full file names (the exception-handler check
    parses the files); each is ended after PY_SPY_TIMEOUT_S. A rank in
    ``stopped`` (SIGSTOP, state T) is read with ``--nonblocking``: py-spy would try to suspend
    it and fail ("Failed to suspend process"), and a stopped process's memory holds still anyway.
    ``local_variables``: with ``--locals`` (each frame's arguments and locals, by type), into
    ``py-spy-<pid>-locals.txt``."""
    running: dict[int, tuple[psutil.Process, subprocess.Popen[str]]] = {}
    for rank, proc in procs.items():
        argv = [py_spy, "dump", "--full-filenames", *(["--locals"] if local_variables else []),
                *(["--nonblocking"] if rank in stopped else []), "--pid", str(proc.pid)]
        try:
            running[rank] = (proc, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        except OSError as exc:
            logger.warning("py-spy dump of %d could not start: %s", proc.pid, exc)
    deadline = time.monotonic() + PY_SPY_TIMEOUT_S
    texts: dict[int, str] = {}
    for rank, (proc, child) in running.items():
        try:
            out, _ = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate()
            out = f"{out or ''}\npy-spy dump timed out after {PY_SPY_TIMEOUT_S:.0f} s\n"
            logger.warning("py-spy dump of %d timed out after %.0f s", proc.pid, PY_SPY_TIMEOUT_S)
        texts[rank] = out or ""
        (folder / f"py-spy-{proc.pid}{'-locals' if local_variables else ''}.txt").write_text(texts[rank])
    return texts


def dump_stacks(
    run_dir: str, attempt: int, root_pid: int | None, root_create: float | None, attempt_dir: Path
) -> StackDump:
    """Save every rank's Python stacks into ``attempt_dir/stacks`` (blocking: up to
    FAULTHANDLER_WAIT_S plus PY_SPY_TIMEOUT_S; run it through :class:`StackDumps`).

    A rank stopped with SIGSTOP cannot run its handler: it gets SIGCONT right after SIGUSR1, so
    it writes its stack, and is stopped again after (its stopped state is part of the result).
    """
    folder = AttemptPaths(attempt_dir).stacks
    folder.mkdir(parents=True, exist_ok=True)
    procs: dict[int, psutil.Process] = {}
    for proc in rank_processes(run_dir, attempt, root_pid, root_create):
        rank = _rank_of(proc)
        if rank is not None:
            procs[rank] = proc
    # Only a rank with runyard's handler gets SIGUSR1; a plain script's rank would die of it.
    handled = {rank: proc for rank, proc in procs.items() if has_stack_handler(proc.pid, rank, folder)}
    unhandled = sorted(procs.keys() - handled.keys())
    stopped, texts = _faulthandler(handled, folder)
    for rank in unhandled:
        try:
            stopped[rank] = procs[rank].status() == psutil.STATUS_STOPPED
        except psutil.Error:
            stopped[rank] = False
    py_spy = py_spy_path()
    spied = _py_spy(py_spy, procs, folder, {r for r, was in stopped.items() if was}) if py_spy and procs else {}
    notes: dict[int, str] = {}
    for rank in unhandled:
        if py_spy is None:
            notes[rank] = (f"rank {rank}'s stack could not be taken: it does not use runyard's SDK (no stack "
                           "handler, and a signal would kill it) and py-spy is not installed (pip install py-spy)")
            (folder / f"rank-{rank}-not-taken.txt").write_text(notes[rank] + "\n")
    ranks = [RankStack(rank, procs[rank].pid, stopped.get(rank, False), texts.get(rank, "").strip()
                       or spied.get(rank, ""), notes.get(rank, ""))
             for rank in sorted(procs)]
    ranks = _with_handlers(ranks, py_spy, procs, folder, {r for r, was in stopped.items() if was})
    return StackDump(folder=folder, files=sorted(folder.iterdir()), ranks=ranks)


def _with_handlers(ranks: list[RankStack], py_spy: str | None, procs: dict[int, psutil.Process], folder: Path,
                   stopped: set[int]) -> list[RankStack]:
    """``ranks`` with the frame each waits in inside an exception handler, and, read by py-spy
    once more with ``--locals`` (only those ranks: locals are data), the exception's type."""
    ranks = [replace(r, handler=handler_frame(main_thread_frames(r.text))) for r in ranks]
    handling = {r.rank: procs[r.rank] for r in ranks if r.handler is not None}
    if not handling or py_spy is None:
        return ranks
    local_variables = _py_spy(py_spy, handling, folder, stopped & handling.keys(), local_variables=True)
    return [replace(r, exception=exception_in_locals(local_variables.get(r.rank, ""))) if r.handler else r
            for r in ranks]


class StackDumps:
    """The scheduler's stack dumps in flight, on a small thread pool of their own.

    Keyed by whatever the caller chooses (the scheduler uses ``(run id, attempt, purpose)``).
    :meth:`start` is a no-op while a dump of that key runs; :meth:`take` hands a finished
    dump's result over once. Nothing here touches the database: the tick records what a dump
    found.
    """

    def __init__(self, workers: int = 2):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="runyard-stacks")
        self._running: dict[Hashable, Future[StackDump]] = {}

    def start(self, key: Hashable, job: Callable[[], StackDump]) -> None:
        """Begin a dump (``job``: the executor's, e.g. :func:`dump_stacks` of a local attempt)
        unless one with this key is already running."""
        if key not in self._running:
            self._running[key] = self._pool.submit(job)

    def running(self, key: Hashable) -> bool:
        """True while the dump with this key has been started and its result not yet taken."""
        return key in self._running

    def take(self, key: Hashable) -> StackDump | BaseException | None:
        """The finished dump's result (or the exception it raised), removed; None while it is
        still running or when none was started."""
        future = self._running.get(key)
        if future is None or not future.done():
            return None
        del self._running[key]
        error = future.exception()
        return error if error is not None else future.result()

    def discard(self, key: Hashable) -> None:
        """Forget a dump whose result nobody will read (it still runs to its end)."""
        self._running.pop(key, None)

    def close(self) -> None:
        """Stop taking dumps; those in flight finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)
