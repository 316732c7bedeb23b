"""Why an attempt ended: the vocabulary of ``attempts.cause``, shared by every process.

The scheduler classifies failures into these causes (orchestrator/scheduler/failures.py reads the evidence),
the retry policy decides by them, and the UI and the CLI count and show them (goodput, the mean
time between interruptions): the vocabulary is stored in the database, so it lives here, below
all of them.
"""

from __future__ import annotations

import enum
import re


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
    DISK = "DISK"  # a write failed: no space, a size limit, a quota, a read-only filesystem or EIO
    RUN_DIR_DELETED = "RUN_DIR_DELETED"  # the run's folder was deleted under it (not retried)
    NODE_FAIL = "NODE_FAIL"  # Slurm lost a node of the job (NODE_FAIL, BOOT_FAIL)
    UNKNOWN = "UNKNOWN"

    def __str__(self) -> str:
        return self.value


# What strikes at random and loses the work since the last save: the failures Young-Daly's mean
# time between failures counts. Not a bug in the training code or a CUDA OOM (they recur and stop
# the run whatever the interval), a preemption (it saves first) or a failed launch.
INTERRUPTIONS = frozenset({Cause.SIGNAL, Cause.SEGFAULT, Cause.OOM_KILLED, Cause.COMM, Cause.HANG, Cause.VANISHED,
                           Cause.UNKNOWN, Cause.NODE_FAIL})


# Parts of an exception message that differ between two occurrences of the same error: the
# checkpoint writer's temporary folder, object addresses, pids, ports, temporary paths, times.
_VOLATILE = [
    (re.compile(r"\.tmp-step-(\d+)-[0-9a-f]+"), r".tmp-step-\1-*"),
    (re.compile(r"\.deleting-step-(\d+)-[0-9a-f]+"), r".deleting-step-\1-*"),
    (re.compile(r"0x[0-9a-fA-F]{4,}"), "0x*"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(\.\d+)?\b"), "*:*:*"),
    (re.compile(r"\b(pid|PID|process)\s*[:=]?\s*\d+"), r"\1 *"),
    # Addresses with a port, never "train.py:50" (a place in the code is part of the error).
    (re.compile(r"\b(?:\d{1,3}(?:\.\d{1,3}){3}|localhost|\[[0-9a-fA-F:]+\]):\d{2,5}\b"), "*:*"),
    (re.compile(r"/tmp/[^\s'\":,)]+"), "/tmp/*"),  # noqa: S108 - recognises /tmp paths in messages
]


def normalize_exception(text: str | None) -> str | None:
    """``text`` with its volatile parts replaced by ``*``, so that the same error raised twice
    compares equal (the retry policy's "same exception twice" rule, a sweep's breaker)."""
    if text is None:
        return None
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return text
