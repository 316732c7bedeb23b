"""What a dump of the ranks' stacks says: each rank's frames, the frame that runs inside an
exception handler and the exception it handles, and the one rank the stacks single out (:func:`culprit`).

A rank that raised and then waits for the other ranks inside its own handler looks hung: every
rank waits, the failing one in its handler's collective, the others in the step's. Lightning's
``OnExceptionCheckpoint`` does exactly this (its ``on_exception`` saves through a barrier while
the ranks that did not raise wait in the gradient all-reduce: Lightning #20187). The hang's
verdict (:func:`culprit`) names
such a rank, and the scheduler books the user's exception instead of a hang.

A frame is inside a handler when its function is one of Lightning's handler functions, which
only its ``except`` blocks call (:data:`HANDLER_FUNCTIONS`), or when its line lies in the body of
an ``except`` block of its source file (parsed with :mod:`ast`). Lightning's
``_call_and_handle_interrupt`` is in every rank's stack (its ``try`` wraps ``fit``), so it is
judged by its line like any other frame, not by its name.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

# Functions that run only inside an exception handler: Lightning's (lightning/pytorch/trainer/call.py
# ``_interrupt``, the ``on_exception`` hooks of callbacks, modules and strategies).
HANDLER_FUNCTIONS = frozenset({"_interrupt", "on_exception"})
# A source file larger than this is not parsed (a generated module): its frames are not judged.
MAX_SOURCE_BYTES = 4 * 2**20

_FAULTHANDLER = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_PY_SPY = re.compile(r"(?P<func>\S+) \((?P<path>.+):(?P<line>\d+)\)$")
# An object py-spy shows as ``<ValueError at 0x7f...>`` among a frame's arguments and locals.
_OBJECT = re.compile(r"<(?P<type>[A-Za-z_][\w.]*) at 0x[0-9a-fA-F]+>")
_EXCEPTION_TYPE = re.compile(r"(Error|Exception|Interrupt|Exit|Failure|Fault)$")
_EXCEPTION_NAMES = frozenset({"e", "ex", "exc", "err", "error", "exception"})
_VARIABLE = re.compile(r"^(?P<name>[A-Za-z_]\w*): (?P<value>.*)$")


@dataclass(frozen=True)
class Frame:
    """One frame of a Python stack: its function, its file and its line."""

    func: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.func} at {Path(self.path).name}:{self.line}"

    @property
    def place(self) -> str:
        """As a failure names the place of an exception: ``train.py:50 in step``."""
        return f"{Path(self.path).name}:{self.line} in {self.func}"


def main_thread_frames(text: str) -> list[Frame]:
    """The frames of the main thread of a faulthandler or py-spy dump (faulthandler's "Current
    thread", py-spy's "MainThread"; else the first thread), innermost first."""
    blocks: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("Thread ", "Current thread ")):
            blocks.append((line, []))
            continue
        m = _FAULTHANDLER.match(line) or _PY_SPY.match(line)
        if m is not None:
            if not blocks:
                blocks.append(("", []))
            blocks[-1][1].append(Frame(m["func"], m["path"], int(m["line"])))
    main = [frames for header, frames in blocks if frames and ("Current thread" in header or "MainThread" in header)]
    return main[-1] if main else next((frames for _, frames in blocks if frames), [])


def handler_bodies(source: str) -> list[tuple[int, int]]:
    """The line ranges (first, last) of the bodies of every ``except`` block in ``source``;
    empty when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return [(node.body[0].lineno, node.end_lineno or node.body[-1].lineno)
            for node in ast.walk(tree) if isinstance(node, ast.ExceptHandler) and node.body]


def _source(path: str) -> str | None:
    try:
        file = Path(path)
        if not file.is_file() or file.stat().st_size > MAX_SOURCE_BYTES:
            return None
        return file.read_text(errors="replace")
    except OSError:
        return None


def handler_frame(frames: list[Frame]) -> Frame | None:
    """The innermost of ``frames`` that runs inside an exception handler, or None.

    Each file is read and parsed once per call; a file that cannot be read here (another node's,
    or gone) judges none of its frames.
    """
    bodies: dict[str, list[tuple[int, int]]] = {}
    for frame in frames:
        if frame.func.rsplit(".", 1)[-1] in HANDLER_FUNCTIONS:
            return frame
        if frame.path not in bodies:
            source = _source(frame.path)
            bodies[frame.path] = handler_bodies(source) if source is not None else []
        if any(first <= frame.line <= last for first, last in bodies[frame.path]):
            return frame
    return None


def exception_in_locals(text: str) -> str | None:
    """The type of the exception a ``py-spy dump --locals`` shows among the main thread's
    arguments and locals (``exception: <ValueError at 0x7f...>``), innermost frame first: the
    first object whose type is named like an exception, else the first object held by a variable
    named like one (``e``, ``exc``, ``err``, ``error``, ``exception``). None when there is none
    (py-spy shows an object's type, never its message)."""
    by_name: str | None = None
    for line in _main_thread_lines(text):
        variable = _VARIABLE.match(line.strip())
        if variable is None:
            continue
        for m in _OBJECT.finditer(variable["value"]):
            if _EXCEPTION_TYPE.search(m["type"]):
                return m["type"]
            if by_name is None and variable["name"] in _EXCEPTION_NAMES:
                by_name = m["type"]
    return by_name


def _main_thread_lines(text: str) -> list[str]:
    """The lines of the main thread's block of a py-spy dump (else of the first thread)."""
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.strip().startswith(("Thread ", "Current thread ")):
            blocks.append((line, []))
        elif blocks:
            blocks[-1][1].append(line)
    main = [lines for header, lines in blocks if "MainThread" in header]
    return main[0] if main else (blocks[0][1] if blocks else [])


# A frame that waits for the other ranks: torch.distributed's collectives (any backend, FSDP's
# hooks; not torchrun's elastic package, whose @record wraps every rank's main), runyard's
# control channel, and autograd's backward, which under DDP ends by waiting for the gradient
# all-reduce.
_COLLECTIVE = re.compile(r"torch/distributed/(?!elastic/)|trainer/control\.py|_engine_run_backward")


@dataclass(frozen=True)
class RankStack:
    """One rank at the moment of the dump."""

    rank: int
    pid: int
    stopped: bool  # in state T (SIGSTOP, a debugger) when the dump began
    text: str  # its newest stacks: what faulthandler appended, else py-spy's output
    note: str = ""  # why no stack could be taken, when none was (empty otherwise)
    handler: Frame | None = None  # the frame of its main thread inside an exception handler, if any
    exception: str | None = None  # the type of the exception that handler handles, when py-spy showed it

    @property
    def in_collective(self) -> bool:
        return bool(_COLLECTIVE.search(self.text))


def culprit(ranks: list[RankStack]) -> tuple[int | None, str]:
    """The rank that alone stopped, and why it is named; ``(None, "")`` when the stacks do not
    single one out (every rank waits, or several are outside a collective).

    First a rank that was stopped (state T) while the others were not; then a rank that waits
    inside an exception handler while the others do not (the lowest, when several but not all
    do: :func:`in_handler`); then the one rank whose stacks show no collective while every other
    rank waits in one.
    """
    if len(ranks) < 2:
        return None, ""
    stopped = [r for r in ranks if r.stopped]
    if len(stopped) == 1:
        return stopped[0].rank, f"rank {stopped[0].rank} was stopped (process state T) while the others ran"
    handling = in_handler(ranks)
    if handling is not None:
        raised = f"it raised {handling.exception} and " if handling.exception else "it raised and "
        return handling.rank, (f"rank {handling.rank} waits inside an exception handler ({handling.handler}): "
                               f"{raised}its handler waits for the other ranks, which wait elsewhere")
    known = [r for r in ranks if r.text.strip()]
    outside = [r for r in known if not r.in_collective]
    if len(outside) == 1 and len(known) == len(ranks):
        where = _top_frame(outside[0].text)
        return outside[0].rank, (f"rank {outside[0].rank} is outside any collective ({where}) while the other "
                                 "ranks wait in one")
    return None, ""


def in_handler(ranks: list[RankStack]) -> RankStack | None:
    """The rank that waits inside an exception handler while the others do not (the lowest when
    several do), or None: none does, or every rank does (then no one rank raised alone)."""
    handling = [r for r in ranks if r.handler is not None]
    return min(handling, key=lambda r: r.rank) if handling and len(handling) < len(ranks) else None


def _top_frame(text: str) -> str:
    """The innermost frame of the first thread in a faulthandler or py-spy dump."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("File "):  # faulthandler: File "path", line N in func
            m = re.match(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', line)
            if m:
                return f"{m['func']} at {Path(m['path']).name}:{m['line']}"
        elif re.match(r"\S+ \(.+:\d+\)$", line):  # py-spy: func (path:line)
            return line
    return "its stack"


def stack_frames(text: str) -> list[str]:
    """The frames of the main thread of a faulthandler or py-spy dump (faulthandler's "Current
    thread", py-spy's "MainThread"; else the first thread), innermost first (``func at file.py:line``)."""
    return [str(frame) for frame in main_thread_frames(text)]
