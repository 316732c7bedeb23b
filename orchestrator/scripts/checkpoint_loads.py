"""A retry that fails loading the script checkpoint it was handed: the version is refused and the
next attempt starts from the one before, as runyard's own workloads fall back past a checkpoint
that will not load (trainer/checkpoint/checkpointer.py).

Without this, a version that merely looked complete (a folder its framework had not finished, a
file in a format whose end cannot be checked) was handed to every retry, each failed the same way
in the script's load, and the retry policy called that the user's repeated error ("the same
exception twice ... retrying cannot help") while an intact version sat beside it.

An attempt *failed loading its checkpoint* (:func:`failed_loading`) when all of these hold:

- it started from a script's own checkpoint version (``RUNYARD_RESUME_PATH``);
- it failed with the script's exception (USER_ERROR), or with a bare non-zero exit (UNKNOWN),
  not a signal, a hang, a preemption, a full disk or a CUDA out-of-memory;
- it reported no step past the one it resumed from;
- its traceback (the exception line and the failing rank's output from its first
  ``Traceback``) names the checkpoint (its path, whole or under the working folder) or a frame
  that loads one: ``torch.load``, safetensors, the Trainer's ``_load_from_checkpoint`` and
  ``load_from_json``, accelerate's ``load_state``, PyTorch Distributed Checkpoint.

Then (:func:`refuse_unloadable`) the version is refused with the exception ("attempt 3 failed
loading it: ..."), so neither a retry nor "the newest" picks it again (a person still may, by its
id); the next attempt starts from the newest intact version older than it, or without a checkpoint
when there is none; an event says which, and the retry is not judged as the user's repeated error.
Not when an earlier attempt of the run already failed loading another version with the same
exception: then the script fails to load any of them (a model changed since the save), and the
retry policy judges it like any other error.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from db.file_versions import is_version
from db.models import Attempt, Checkpoint, Event, Run
from db.requests import SCRIPT_SOURCE, workdir_of
from db.vocabulary.causes import Cause

logger = logging.getLogger(__name__)

LOAD_FAILED = "failed loading it"  # in refused_reason: "attempt 3 failed loading it: <exception>"
# The causes a failed load ends with: the script's exception, or an exit without one.
LOAD_CAUSES = frozenset({Cause.USER_ERROR.value, Cause.UNKNOWN.value})
TRACEBACK = "Traceback (most recent call last):"
# Frames and messages of a checkpoint being loaded, in a traceback.
_LOADING = re.compile(
    r"torch/serialization\.py|\btorch\.load\(|safetensors|PytorchStreamReader|UnpicklingError"
    r"|_load_from_checkpoint|load_from_json|\bload_state\(|accelerate/checkpointing\.py"
    r"|torch/distributed/checkpoint/")


@dataclass(frozen=True)
class Fallback:
    """A version refused after a retry failed loading it, and where the next attempt starts.

    Attributes:
        refused: The version the attempt failed to load.
        then: The newest intact version older than it, or None (the next attempt starts without one).
    """

    refused: Checkpoint
    then: Checkpoint | None

    def words(self, attempt: int) -> str:
        what = f"checkpoint {self.refused.id} ({self.refused.origin or self.refused.path}, step {self.refused.step})"
        then = (f"the next attempt starts from the version before it, checkpoint {self.then.id} "
                f"({self.then.origin or self.then.path}, step {self.then.step})" if self.then is not None
                else "no older version of the run's own is intact: the next attempt starts without a checkpoint")
        return (f"attempt {attempt} failed loading {what}, so that version is refused (a person may still name it) "
                f"and {then}")


def failed_loading(attempt: Attempt, workdir: Path) -> bool:
    """Whether ``attempt`` (settled: its cause, exception and log tail recorded) failed loading the
    script checkpoint it started from (see the module's docstring)."""
    if attempt.resume_path is None or attempt.stop_reason is not None or attempt.cause not in LOAD_CAUSES:
        return False
    if attempt.last_step is not None and attempt.last_step > (attempt.resume_step or 0):
        return False  # it trained past its checkpoint: whatever failed, the load did not
    tail = attempt.log_tail or ""
    text = f"{attempt.exception or ''}\n{tail[tail.find(TRACEBACK):] if TRACEBACK in tail else ''}"
    named = [attempt.resume_path]
    if Path(attempt.resume_path).is_relative_to(workdir):
        named.append(Path(attempt.resume_path).relative_to(workdir).as_posix())
    return any(len(n) > 1 and n in text for n in named) or _LOADING.search(text) is not None


def resumed_from(session: Session, run: Run, attempt: Attempt) -> Checkpoint | None:
    """The script checkpoint version ``attempt`` was handed: the run's own at its resume path and
    step, recorded before it started, else a fork's origin at that step."""
    if attempt.resume_path is None or attempt.resume_step is None:
        return None
    at = (Checkpoint.source == SCRIPT_SOURCE, Checkpoint.step == attempt.resume_step,
          Checkpoint.created_at <= attempt.started_at)
    own = session.execute(
        select(Checkpoint).where(*at, Checkpoint.run_id == run.id,
                                 or_(Checkpoint.origin == attempt.resume_path, Checkpoint.path == attempt.resume_path))
        .order_by(Checkpoint.created_at.desc(), Checkpoint.id.desc()).limit(1)).scalar_one_or_none()
    if own is not None or run.parent_checkpoint_id is None:
        return own
    origin = select(Checkpoint).where(*at, Checkpoint.id == run.parent_checkpoint_id)
    return session.execute(origin).scalar_one_or_none()


def older_intact(session: Session, run: Run, refused: Checkpoint) -> Checkpoint | None:
    """The run's newest intact version written before ``refused``: verified, not deleted, not
    refused, and still the bytes recorded."""
    rows = session.execute(
        select(Checkpoint).where(Checkpoint.run_id == run.id, Checkpoint.source == SCRIPT_SOURCE,
                                 Checkpoint.verified.is_(True), Checkpoint.deleted.is_(False),
                                 Checkpoint.refused_reason.is_(None), Checkpoint.id != refused.id,
                                 Checkpoint.file_mtime < (refused.file_mtime or math.inf))
        .order_by(Checkpoint.file_mtime.desc(), Checkpoint.id.desc())).scalars()
    return next((row for row in rows if is_version(row.path, row.bytes, row.file_mtime)), None)


def refuse_unloadable(session: Session, run: Run, attempt: Attempt,
                      same: Callable[[str | None, str | None], bool]) -> Fallback | None:
    """When ``attempt`` failed loading the script checkpoint it was handed: refuse that version,
    point the run's next attempt at the one before (``runs.resume_checkpoint_id``; none: it starts
    without a checkpoint), say so in an event, and return what was done; else None (the caller
    commits).

    Args:
        same: Whether two exception lines are the same error (the retry policy's comparison).
    """
    workdir = workdir_of(run)
    if not failed_loading(attempt, workdir):
        return None
    row = resumed_from(session, run, attempt)
    if row is None or row.refused_reason is not None:
        return None
    earlier = session.execute(select(Attempt).where(Attempt.run_id == run.id, Attempt.number < attempt.number,
                                                    Attempt.exception.is_not(None))).scalars()
    if any(same(a.exception, attempt.exception) and failed_loading(a, workdir) for a in earlier):
        return None  # another version failed to load the same way: the script, not the checkpoint
    row.refused_reason = f"attempt {attempt.number} {LOAD_FAILED}: {attempt.exception or 'it exited with an error'}"
    fallback = Fallback(row, older_intact(session, run, row))
    if fallback.then is not None:
        run.resume_checkpoint_id = fallback.then.id
    else:
        run.start_fresh = True
    message = fallback.words(attempt.number)
    logger.warning("run %d: %s", run.id, message)
    session.add(Event(run_id=run.id, attempt=attempt.number, at=time.time(), level="warning", kind="resume",
                      message=message))
    return fallback
