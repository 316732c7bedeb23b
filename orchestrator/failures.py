"""Failure classification: what ended an attempt, on which rank, and with which exception.

The evidence, most specific first: torchrun's per-rank error files (the ``@record`` mechanism:
the exception and traceback of every rank that raised), torchrun's failure summary in the
launcher log (every failed rank with its exit code or signal), the kernel's OOM-killer
messages, and the ranks' stderr. When one rank dies, the others die of the fallout (a closed
connection, SIGTERM from torchrun); the root cause is chosen over them.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.logs import launcher_log, rank_log_files, tail

logger = logging.getLogger(__name__)


class Cause(str, enum.Enum):
    USER_ERROR = "USER_ERROR"  # an exception in the training code
    CUDA_OOM = "CUDA_OOM"
    COMM = "COMM"  # NCCL/gloo communication failure or timeout
    SEGFAULT = "SEGFAULT"
    OOM_KILLED = "OOM_KILLED"  # SIGKILL from the kernel's OOM killer
    SIGNAL = "SIGNAL"  # killed by a signal from outside
    HANG = "HANG"  # no progress: stacks saved, then killed by runyard
    PREEMPTED = "PREEMPTED"  # SIGTERM that runyard did not send; stopped with a checkpoint
    VANISHED = "VANISHED"  # the launcher disappeared without an exit code
    LAUNCH_FAILED = "LAUNCH_FAILED"
    DISK = "DISK"  # a write failed for want of space or size (ENOSPC, EFBIG, EDQUOT) or with EIO
    UNKNOWN = "UNKNOWN"

    def __str__(self) -> str:
        return self.value


# What strikes at random and loses the work since the last save: the failures Young-Daly's mean
# time between failures counts. Not a bug in the training code or a CUDA OOM (they recur and stop
# the run whatever the interval), a preemption (it saves first) or a failed launch.
INTERRUPTIONS = frozenset({Cause.SIGNAL, Cause.SEGFAULT, Cause.OOM_KILLED, Cause.COMM, Cause.HANG, Cause.VANISHED,
                           Cause.UNKNOWN})


COMM_PATTERNS = re.compile(
    r"NCCL|gloo|Gloo|Connection closed by peer|Connection reset by peer|connectFullMesh|"
    r"DistBackendError|DistNetworkError|Broken pipe|ProcessGroup.*timed? ?out|Watchdog caught collective",
)
CUDA_OOM_PATTERNS = re.compile(r"OutOfMemoryError|CUDA out of memory")
# What a failed write says when the disk is full, a file-size limit is hit, a quota is exceeded or
# the device fails: errno text as Python prints it, and SQLite's own words.
DISK_PATTERNS = re.compile(
    r"\[Errno (?:28|27|122|5)\]|No space left on device|File too large|Disk quota exceeded|"
    r"Input/output error|database or disk is full|disk I/O error|PytorchStreamWriter failed writing",
)
_EXCEPTION_LINE = re.compile(r"^\w+(\.\w+)*(Error|Exception|Interrupt|Exit)\b")


@dataclass(frozen=True)
class RankFailure:
    """One failed rank as torchrun reported it."""

    rank: int
    exitcode: int | None
    pid: int | None
    message: str | None  # the exception line, from the error file
    traceback: str | None


@dataclass(frozen=True)
class Failure:
    """The classified end of an attempt."""

    cause: Cause
    rank: int | None
    exception: str | None
    log_tail: str
    signal_name: str | None = None
    detail: str | None = None  # said after the exception, never compared (free space changes)

    def summary(self) -> str:
        where = f" on rank {self.rank}" if self.rank is not None else ""
        what = f": {self.exception}" if self.exception else (f" ({self.signal_name})" if self.signal_name else "")
        more = f" ({self.detail})" if self.detail else ""
        return f"{self.cause.value}{where}{what}{more}"


_BLOCK = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)"
    r".*?\n\s*error_file\s*:\s*(?P<file>\S+)",
    re.S,
)


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


def rank_failures(attempt_dir: Path) -> list[RankFailure]:
    """Every failed rank from torchrun's failure summary in the launcher log."""
    text = tail(launcher_log(attempt_dir), 200_000)
    found: dict[int, RankFailure] = {}
    for m in _BLOCK.finditer(text):
        rank = int(m["rank"])
        message, trace = _error_file(m["file"])
        found[rank] = RankFailure(rank=rank, exitcode=int(m["code"]), pid=int(m["pid"]), message=message, traceback=trace)
    return [found[r] for r in sorted(found)]


def _oom_killed_pids() -> set[int]:
    """PIDs the kernel's OOM killer killed, when the kernel log can be read."""
    if not shutil.which("dmesg"):
        return set()
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=2).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {int(p) for p in re.findall(r"Killed process (\d+)", out)}


def signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _stderr_tail(attempt_dir: Path, rank: int | None, lines: int = 30) -> str:
    files = rank_log_files(attempt_dir)
    paths = files.get(rank, []) if rank is not None else []
    stderr = [p for p in paths if p.name == "stderr.log"]
    source = stderr[0] if stderr else launcher_log(attempt_dir)
    return "\n".join(tail(source, 16_000).splitlines()[-lines:])


def _exception_from_stderr(attempt_dir: Path) -> tuple[int | None, str | None]:
    """The last exception line of any rank's stderr (for ranks that died before @record)."""
    for rank, paths in rank_log_files(attempt_dir).items():
        for path in paths:
            if path.name != "stderr.log":
                continue
            hits = [ln.strip() for ln in tail(path, 16_000).splitlines() if _EXCEPTION_LINE.match(ln.strip())]
            if hits:
                return rank, hits[-1][:500]
    return None, None


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
    stray ``kill``. Its ranks die with it (trainer/pdeathsig.py); the rank exit codes that
    follow are fallout, so the agent's own death is the cause."""
    name = signal_name(exit_code)
    if exit_code == -signal.SIGSEGV:
        cause = Cause.SEGFAULT
    elif exit_code == -signal.SIGKILL and agent_pid is not None and agent_pid in _oom_killed_pids():
        cause = Cause.OOM_KILLED
    else:
        cause = Cause.SIGNAL
    who = f"the torchrun agent (pid {agent_pid})" if agent_pid else "the torchrun agent"
    return Failure(cause, None, f"{who} was killed by {name}", _stderr_tail(attempt_dir, None), name)


def classify(attempt_dir: Path, exit_code: int | None) -> Failure:
    """Classify a failed attempt (non-zero exit) from the evidence in its folder.

    A disk failure also names the path it wrote and the free space there now.
    """
    failure = _classify(attempt_dir, exit_code)
    if failure.cause is Cause.DISK:
        failure = dataclasses.replace(failure, detail=disk_detail(failure.exception or "", attempt_dir))
    return failure


def _classify(attempt_dir: Path, exit_code: int | None) -> Failure:
    failures = rank_failures(attempt_dir)
    # Root cause first: a rank killed from outside, then a real exception, then comm errors
    # (usually the fallout), then ranks torchrun itself terminated.
    killed = [f for f in failures if f.exitcode is not None and f.exitcode < 0 and f.exitcode != -signal.SIGTERM
              and not f.message]
    raised = [f for f in failures if f.message and _cause_of_exception(f.message) is not Cause.COMM]
    comm = [f for f in failures if f.message and _cause_of_exception(f.message) is Cause.COMM]
    if killed:
        f = killed[0]
        assert f.exitcode is not None
        name = signal_name(f.exitcode)
        if f.exitcode == -signal.SIGSEGV:
            cause = Cause.SEGFAULT
        elif f.exitcode == -signal.SIGKILL and f.pid in _oom_killed_pids():
            cause = Cause.OOM_KILLED
        else:
            cause = Cause.SIGNAL
        return Failure(cause, f.rank, f"killed by {name}", _stderr_tail(attempt_dir, f.rank), name)
    for group in (raised, comm):
        if group:
            f = group[0]
            assert f.message is not None
            return Failure(_cause_of_exception(f.message), f.rank, f.message, _stderr_tail(attempt_dir, f.rank))
    rank, line = _exception_from_stderr(attempt_dir)
    if line:
        return Failure(_cause_of_exception(line), rank, line, _stderr_tail(attempt_dir, rank))
    if exit_code is not None and exit_code < 0:
        name = signal_name(exit_code)
        return Failure(Cause.SIGNAL, None, f"launcher killed by {name}", _stderr_tail(attempt_dir, None), name)
    return Failure(Cause.UNKNOWN, None, f"exit code {exit_code}", _stderr_tail(attempt_dir, None))


# Parts of an exception message that differ between two occurrences of the same error: the
# checkpoint writer's temporary folder, object addresses, pids, ports, temporary paths, times.
_VOLATILE = [
    (re.compile(r"\.tmp-step-(\d+)-[0-9a-f]+"), r".tmp-step-\1-*"),
    (re.compile(r"\.deleting-step-(\d+)-[0-9a-f]+"), r".deleting-step-\1-*"),
    (re.compile(r"0x[0-9a-fA-F]{4,}"), "0x*"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(\.\d+)?\b"), "*:*:*"),
    (re.compile(r"\b(pid|PID|process)\s*[:=]?\s*\d+"), r"\1 *"),
    (re.compile(r"(?<=[:\s])(?:127\.0\.0\.1|localhost|\[::1\]|[\w.-]+):\d{2,5}\b"), "*:*"),
    (re.compile(r"/tmp/[^\s'\":,)]+"), "/tmp/*"),
]


def normalize_exception(text: str | None) -> str | None:
    """``text`` with its volatile parts replaced by ``*``, so that the same error raised twice
    compares equal (the retry policy's "same exception twice" rule)."""
    if text is None:
        return None
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return text


_PATH = re.compile(r"(/[^\s'\":,()\[\]]+)")


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a failed write leaves no file behind)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing ancestor)."""
    try:
        return shutil.disk_usage(nearest_existing(path)).free
    except OSError:
        return None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def disk_detail(message: str, attempt_dir: Path) -> str:
    """Where a failed write went and how much room is there now: the first absolute path in the
    message (else the run's folder), and the free space on its filesystem."""
    found = _PATH.search(message)
    path = Path(found.group(1)) if found else attempt_dir.parent.parent
    free = free_bytes(path)
    room = f"{human_bytes(free)} free on its filesystem now" if free is not None else "free space unknown"
    return f"writing {path}; {room}"
