"""Failure classification: what ended an attempt, on which rank, and with which exception.

The evidence, most specific first: torchrun's per-rank error files (the ``@record`` mechanism:
the exception and traceback of every rank that raised), torchrun's failure summary in the
launcher log (every failed rank with its exit code or signal, and which one it saw fail first),
the kernel's OOM-killer messages, and the ranks' stderr. When one rank dies, the others die of
the fallout (a closed connection, SIGTERM from torchrun); the root cause is chosen over them.

A rank's stderr, as torchrun writes it, has ``[rankN]:`` in front of every line; a script that
does not use ``@record`` leaves no error file, so its exception is the first traceback in its
stderr. An exception is reported with its place, the innermost frame of its traceback
(``ValueError: boom (at train.py:50 in step)``), so that "the same exception twice" (the retry
policy compares ``Failure.exception``) means the same exception raised at the same place.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from db.vocabulary.causes import Cause
from orchestrator.executors.logs import launcher_log, rank_log_files, tail
from orchestrator.scheduler.storage import STORAGE_ERRNOS, disk_detail

logger = logging.getLogger(__name__)


# What a failed transport or a timed-out collective says. Not every message that names gloo or
# NCCL: "ProcessGroupGloo::broadcast: invalid root rank: 2" is a bug in the caller.
COMM_PATTERNS = re.compile(
    r"NCCL error|NCCL communicator|nccl(Internal|System|Remote|UnhandledCuda)Error|gloo/transport|gloo::|"
    r"Connection closed by peer|Connection reset by peer|connectFullMesh|Timed out waiting .* for (recv|send)|"
    r"DistBackendError|DistNetworkError|Broken pipe|ProcessGroup.*timed? ?out|Watchdog caught collective",
)
CUDA_OOM_PATTERNS = re.compile(r"OutOfMemoryError|CUDA out of memory")
# What a failed write says when the disk is full, a file-size limit is hit, a quota is exceeded,
# the filesystem is read-only or the device fails: errno text as Python prints it, and SQLite's
# own words. The errnos are orchestrator/scheduler/storage.py's STORAGE_ERRNOS, its one list.
DISK_PATTERNS = re.compile(
    rf"\[Errno (?:{'|'.join(str(code) for code in sorted(STORAGE_ERRNOS))})\]|"
    r"No space left on device|File too large|Disk quota exceeded|"
    r"Input/output error|Read-only file system|database or disk is full|disk I/O error|"
    r"attempt to write a readonly database|PytorchStreamWriter failed writing",
)
_EXCEPTION_LINE = re.compile(r"^\w+(\.\w+)*(Error|Exception|Interrupt|Exit)\b")
# torchrun's prefix on each line of a rank's stderr ("[rank1]: ..."), or of its console copy
# with --tee ("[default1]:...").
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:[ ]?")
_TRACEBACK_HEAD = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S.*?))?\s*$')
_EXCEPTION_START = re.compile(r"^[A-Za-z_][\w.]*(:|\s*$)")
STDERR_WINDOW = 256 * 1024  # bytes of a rank's stderr read for its traceback (the end of it)


@dataclass(frozen=True)
class RankFailure:
    """One failed rank as torchrun reported it."""

    rank: int
    exitcode: int | None
    pid: int | None
    message: str | None  # the exception line, from the error file
    traceback: str | None
    local_rank: int | None = None  # its rank on its node (torchrun names its log folder so)
    root: bool = False  # torchrun's "Root Cause (first observed failure)"
    location: str | None = None  # the innermost frame of the traceback: "train.py:50 in step"


@dataclass(frozen=True)
class Raised:
    """An exception as its traceback shows it.

    Attributes:
        exception: The exception line, e.g. ``ValueError: loss went NaN`` (its first line).
        location: The innermost frame, ``file:line in function`` (the file shortened to its name,
            or its path under site-packages), or None when the traceback had no frame.
        traceback: The traceback's text, without torchrun's rank prefix.
    """

    exception: str
    location: str | None
    traceback: str


@dataclass(frozen=True)
class Failure:
    """The classified end of an attempt."""

    cause: Cause
    rank: int | None
    exception: str | None  # the exception line and its place: "ValueError: boom (at train.py:50 in step)"
    log_tail: str
    signal_name: str | None = None
    location: str | None = None  # the place alone: "train.py:50 in step"
    detail: str | None = None  # said after the exception, never compared (free space changes)

    def summary(self) -> str:
        where = f" on rank {self.rank}" if self.rank is not None else ""
        what = f": {self.exception}" if self.exception else (f" ({self.signal_name})" if self.signal_name else "")
        more = f" ({self.detail})" if self.detail else ""
        return f"{self.cause.value}{where}{what}{more}"


_BLOCK = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)\s*"
    r"\(pid:\s*(?P<pid>\d+)\)"
    r".*?\n\s*error_file\s*:\s*(?P<file>\S+)[^\n]*(?P<rest>.*?)(?=^\s*[-=]{20,}\s*$|^\[\d+\]:|\Z)",
    re.S | re.M,
)
_ROOT_HEAD = "Root Cause (first observed failure):"


def strip_rank_prefix(text: str) -> str:
    """``text`` without torchrun's ``[rankN]:`` in front of each line."""
    return "\n".join(_RANK_PREFIX.sub("", line, count=1) for line in text.splitlines())


def _short_path(path: str) -> str:
    """A frame's file as a person reads it: the path under site-packages, else the file name."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path.rsplit("/", 1)[-1]


def parse_traceback(text: str) -> Raised | None:
    """The first Python traceback in ``text`` (torchrun's rank prefixes allowed): its exception
    line and the innermost frame. None when there is no complete one.

    The first, because what follows it is the fallout: "During handling of the above
    exception...", an error in an ``atexit`` handler, a collective broken by the first failure.
    """
    lines = strip_rank_prefix(text).splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.rstrip().endswith(_TRACEBACK_HEAD)), None)
    if start is None:
        return None
    frame: re.Match[str] | None = None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if (m := _FRAME.match(line)) is not None:
            frame = m
        elif _EXCEPTION_START.match(line):
            # The first unindented "Name: ..." after the frames (code and carets are indented;
            # a C++ warning printed in between starts with "[").
            where = None
            if frame is not None:
                where = f"{_short_path(frame['file'])}:{frame['line']}"
                where += f" in {frame['func']}" if frame["func"] else ""
            return Raised(line.strip()[:500], where, "\n".join(lines[start:i + 1]))
    return None


def with_location(exception: str, location: str | None) -> str:
    """The exception line with its place, as a failure reports it."""
    return f"{exception} (at {location})" if location else exception


def _error_file(path: str) -> tuple[str | None, str | None]:
    if path in ("<N/A>", ""):
        return None, None
    try:
        data = json.loads(Path(path).read_text())
        message = data["message"]
        text = message["message"] if isinstance(message, dict) else str(message)
        trace = message.get("extraInfo", {}).get("py_callstack") if isinstance(message, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # The exception line, not a trailer after it (pybind adds "At:" and a Python frame to an
    # error raised in a callback, such as a DDP communication hook's future).
    exceptions = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
    chosen = exceptions[-1] if exceptions else (lines[0] if lines else None)
    return (chosen[:500] if chosen else None), trace


def _summary_traceback(rest: str) -> Raised | None:
    """The traceback torchrun printed in a failure's ``traceback :`` field (from the error file,
    which may be gone or on another host), indented under the field."""
    head = rest.find(_TRACEBACK_HEAD)
    if head < 0:
        return None
    body = [ln[2:] if ln.startswith("  ") else ln for ln in rest[head:].splitlines()[1:]]
    return parse_traceback("\n".join([_TRACEBACK_HEAD, *body]))


def rank_failures(attempt_dir: Path) -> list[RankFailure]:
    """Every failed rank from torchrun's failure summary in the launcher log (the exception from
    each rank's error file, or from the summary's copy of it)."""
    text = tail(launcher_log(attempt_dir), 200_000)
    root_at = text.rfind(_ROOT_HEAD)
    found: dict[int, RankFailure] = {}
    for m in _BLOCK.finditer(text):
        rank = int(m["rank"])
        message, trace = _error_file(m["file"])
        raised = parse_traceback(trace) if trace else _summary_traceback(m["rest"])
        if message is None and raised is not None and m["file"] != "<N/A>":
            message, trace = raised.exception, raised.traceback  # the error file is gone
        root = 0 <= root_at < m.start()
        if rank in found and not root:
            continue
        found[rank] = RankFailure(rank=rank, exitcode=int(m["code"]), pid=int(m["pid"]), message=message,
                                  traceback=trace, local_rank=int(m["local"]), root=root,
                                  location=raised.location if raised and message else None)
    return [found[r] for r in sorted(found)]


def _oom_killed_pids() -> set[int]:
    """PIDs the kernel's OOM killer killed, when the kernel log can be read."""
    if not shutil.which("dmesg"):
        return set()
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=2).stdout  # noqa: S607 - the system's dmesg, found by shutil.which above
    except (OSError, subprocess.SubprocessError):
        return set()
    return {int(p) for p in re.findall(r"Killed process (\d+)", out)}


def signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _stderr_path(attempt_dir: Path, rank: int | None) -> Path | None:
    """The stderr file of global rank ``rank`` (orchestrator/executors/logs.py maps local-rank folders)."""
    paths = rank_log_files(attempt_dir).get(rank, []) if rank is not None else []
    return next((p for p in paths if p.name == "stderr.log"), None)


def stderr_tail(attempt_dir: Path, rank: int | None, lines: int = 30) -> str:
    """The last lines of rank ``rank``'s stderr, or of the launcher log (``rank`` None, or no file)."""
    source = _stderr_path(attempt_dir, rank) or launcher_log(attempt_dir)
    return "\n".join(tail(source, 16_000).splitlines()[-lines:])


def stderr_exception(path: Path) -> Raised | None:
    """The first traceback in the end of a rank's stderr (``STDERR_WINDOW`` bytes)."""
    return parse_traceback(tail(path, STDERR_WINDOW))


# Signals a rank's own uncaught exception can end in, so its traceback is still the story:
# SIGTERM (torchrun stopping it), SIGABRT (the interpreter's exit aborting on a C++ thread still
# running, "terminate called without an active exception", seen on gloo ranks now and then).
_AFTER_AN_EXCEPTION = frozenset({-signal.SIGTERM, -signal.SIGABRT})


def _with_stderr(attempt_dir: Path, failure: RankFailure) -> RankFailure:
    """``failure`` with the exception of its rank's stderr when torchrun had none (no ``@record``)."""
    if failure.message is not None or (failure.exitcode is not None and failure.exitcode < 0
                                       and failure.exitcode not in _AFTER_AN_EXCEPTION):
        return failure  # a rank killed by a signal: the signal is its story, not an older traceback
    path = _stderr_path(attempt_dir, failure.rank)
    raised = stderr_exception(path) if path is not None else None
    if raised is None:
        return failure
    return replace(failure, message=raised.exception, traceback=raised.traceback, location=raised.location)


def _from_stderr_only(attempt_dir: Path) -> list[RankFailure]:
    """Every rank whose stderr holds a traceback, when torchrun wrote no failure summary."""
    found = []
    for rank, paths in rank_log_files(attempt_dir).items():
        stderr = next((p for p in paths if p.name == "stderr.log"), None)
        raised = stderr_exception(stderr) if stderr is not None else None
        if raised is not None:
            found.append(RankFailure(rank=rank, exitcode=None, pid=None, message=raised.exception,
                                     traceback=raised.traceback, location=raised.location))
    return found


def _cause_of_exception(message: str) -> Cause:
    if CUDA_OOM_PATTERNS.search(message):
        return Cause.CUDA_OOM
    if DISK_PATTERNS.search(message):
        return Cause.DISK
    if COMM_PATTERNS.search(message):
        return Cause.COMM
    return Cause.USER_ERROR


def agent_killed(attempt_dir: Path, exit_code: int, agent_pid: int | None) -> Failure:
    """torchrun's agent died of a signal (the shim recorded ``exit_code`` < 0): the OOM killer, a
    stray ``kill``. Its ranks die with it (trainer/process/pdeathsig.py); the rank exit codes that
    follow are fallout, so the agent's own death is the cause."""
    name = signal_name(exit_code)
    if exit_code == -signal.SIGSEGV:
        cause = Cause.SEGFAULT
    elif exit_code == -signal.SIGKILL and agent_pid is not None and agent_pid in _oom_killed_pids():
        cause = Cause.OOM_KILLED
    else:
        cause = Cause.SIGNAL
    who = f"the torchrun agent (pid {agent_pid})" if agent_pid else "the torchrun agent"
    return Failure(cause, None, f"{who} was killed by {name}", stderr_tail(attempt_dir, None), name)


def _root_cause(failures: list[RankFailure]) -> RankFailure | None:
    """The failure that caused the others, in this order: a rank killed from outside, a real
    exception, a rank that exited with a code of its own accord and that torchrun saw fail
    first, a communication error (usually the fallout), any other rank that exited with a code.
    Within each, torchrun's first observed failure, then the lowest rank. SIGTERM is torchrun
    stopping the survivors, never a cause."""
    def is_comm(f: RankFailure) -> bool:
        return f.message is not None and _cause_of_exception(f.message) is Cause.COMM

    groups = (
        [f for f in failures if f.exitcode is not None and f.exitcode < 0 and f.exitcode != -signal.SIGTERM
         and not f.message],
        [f for f in failures if f.message and not is_comm(f)],
        [f for f in failures if f.root and not f.message and f.exitcode is not None and f.exitcode > 0],
        [f for f in failures if is_comm(f)],
        [f for f in failures if not f.message and f.exitcode is not None and f.exitcode > 0],
    )
    for group in groups:
        if group:
            return min(group, key=lambda f: (not f.root, f.rank))
    return None


# argparse refusing a script's command line: its usage, then "PROG: error: WHAT", exit code 2.
_USAGE_ERROR = re.compile(r"^usage: .*?^(?P<refusal>\S+: error: .+?)\s*\Z", re.MULTILINE | re.DOTALL)
USAGE_REFUSED = "(exit code 2: the script refused its command line)"


def usage_error(stderr_tail_text: str) -> str | None:
    """argparse's refusal at the end of a rank's stderr (``train.py: error: unrecognized
    arguments: --lf 0.1``), or None."""
    found = _USAGE_ERROR.search(strip_rank_prefix(stderr_tail_text).strip())
    return found["refusal"] if found and "\n" not in found["refusal"] else None


def _failure_of(attempt_dir: Path, f: RankFailure) -> Failure:
    tail_of = stderr_tail(attempt_dir, f.rank)
    if f.message:
        return Failure(_cause_of_exception(f.message), f.rank, with_location(f.message, f.location), tail_of,
                       location=f.location)
    assert f.exitcode is not None
    refusal = usage_error(tail_of) if f.exitcode == 2 else None
    if refusal is not None:  # the same command line is refused the same way on every retry
        return Failure(Cause.USER_ERROR, f.rank, f"{refusal} {USAGE_REFUSED}", tail_of)
    if f.exitcode > 0:
        return Failure(Cause.UNKNOWN, f.rank, f"exit code {f.exitcode}", tail_of)
    name = signal_name(f.exitcode)
    if f.exitcode == -signal.SIGSEGV:
        cause = Cause.SEGFAULT
    elif f.exitcode == -signal.SIGKILL and f.pid in _oom_killed_pids():
        cause = Cause.OOM_KILLED
    else:
        cause = Cause.SIGNAL
    return Failure(cause, f.rank, f"killed by {name}", tail_of, name)


def classify(attempt_dir: Path, exit_code: int | None) -> Failure:
    """Classify a failed attempt (non-zero exit) from the evidence in its folder.

    A disk failure also names the path it wrote and the free space there now.
    """
    failure = _classify(attempt_dir, exit_code)
    if failure.cause is Cause.DISK:
        failure = dataclasses.replace(failure, detail=disk_detail(failure.exception or "", attempt_dir))
    return failure


def _classify(attempt_dir: Path, exit_code: int | None) -> Failure:
    failures = [_with_stderr(attempt_dir, f) for f in rank_failures(attempt_dir)] or _from_stderr_only(attempt_dir)
    chosen = _root_cause(failures)
    if chosen is not None:
        return _failure_of(attempt_dir, chosen)
    if exit_code is not None and exit_code < 0:
        name = signal_name(exit_code)
        return Failure(Cause.SIGNAL, None, f"launcher killed by {name}", stderr_tail(attempt_dir, None), name)
    return Failure(Cause.UNKNOWN, None, f"exit code {exit_code}", stderr_tail(attempt_dir, None))
