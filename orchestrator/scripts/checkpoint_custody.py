"""A script's own checkpoint files as checkpoint rows, and the one the next attempt starts from.

While an attempt of a script run with ``[workload] checkpoint_glob`` runs (and once more when it
ends), the scheduler lists the matching files (orchestrator/scripts/checkpoint_finder.py) and
records each *version* of each file as a ``Checkpoint`` row with ``source = "script"``: a file
is recorded once it is stable (unchanged at two looks in a row and complete: a folder with the
file its framework writes last, anything without such a marker unchanged for the settle time; for
a file rewritten faster than the looks, a complete zip read whole, at most every 30 s: the
finder's snapshot), and verified once its sha256 is known. A file the script rewrites in place
(nanoGPT's ``out/ckpt.pt``) is a new version: a new row, and the row of the version it replaced is
marked deleted ("overwritten by the script"), unless it was pinned (a pinned version's bytes were
copied into the run's folder, out of the script's reach).

The step of a version: the step the checkpoint itself holds, where its framework records it
(Hugging Face's ``trainer_state.json``, Lightning's ``global_step``, nanoGPT's ``iter_num``, a
number in its name: orchestrator/scripts/checkpoint_steps.py). Else the newest step the attempt
had reported (through the SDK, ``RUNYARD`` lines, ``stdout_metrics`` or TensorBoard) at the
file's modification time, i.e. the steps the script had completed when it saved; a printed line's
time is when runyard read it (within a tick), so that step may lag the truth by the steps of a
tick, never lead it. A file older than the attempt, or written before any step was reported,
then gets the step the attempt started from (0 from scratch). Steps lost by a failed attempt
count from it, and a resume from it says so.

A checkpoint folder (a glob that matches folders) is one version, handled like a file
(db/file_versions.py: its size, time and digest over its files; copied whole when pinned).

Before an attempt starts from such a version, :func:`resume_point` checks that the file is still
that version (its size and modification time), falls back to the newest intact recorded version
of the same file when the script overwrote it (with an event), and puts it where the script
looks for it (its path under ``workdir``) when another version lies there, keeping the one it
displaces.

What is not handed over automatically: a version that is not verified (not stable and hashed
yet); a zip archive (``torch.save``'s default format) without its end record, i.e. a file whose
writer was killed mid-save and that merely looked stable afterwards (recorded, refused
"truncated (no zip end record)"); a folder without the file its framework writes last (the
Trainer's ``trainer_state.json``, DCP's ``.metadata``: orchestrator/scripts/checkpoint_layouts.py),
which is recorded only when its attempt has ended, refused "incomplete"; a version a retry failed
to load (orchestrator/scripts/checkpoint_loads.py); and a file that was already there when the
run's first attempt started (a previous experiment's ``out/ckpt.pt`` in a shared workdir:
recorded, refused "existed before the run started", with whose it probably is: another run that
recorded the same file or the same bytes, or none runyard knows). A person may still resume or
fork from a refused version that is verified, by naming its id; "the newest" and "at step N"
never pick one (db/requests.py's ``usable_checkpoint``), nor does a retry.

File work (hashing, copying) is done before the transaction's first write where it can be, so
the SQLite write lock is not held while gigabytes are read: :func:`resume_point` runs before the
attempt's rows are written and queues its events without flushing. A crash between a copy and
the commit leaves at most an orphan copy under ``checkpoints/script/`` (no row points at it) or
a file moved aside in the workdir, which the events of the next try describe again.
"""

from __future__ import annotations

import logging
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from db.file_versions import MTIME_TOLERANCE_S, CopyRefused, copy_verified, is_version
from db.models import Attempt, Checkpoint, Event, MetricPoint, Run
from db.requests import PREEXISTING, SCRIPT_SOURCE, checkpoints_dir, keep_copy, newest_intact, workdir_of
from orchestrator.scripts.checkpoint_finder import ZIP_MAGIC, CheckpointFile

logger = logging.getLogger(__name__)

SCRIPT = SCRIPT_SOURCE
TRUNCATED = "truncated (no zip end record)"
INCOMPLETE = "incomplete"  # refused_reason's start for a folder without its framework's last file
ZIP_SUFFIXES = (".zip",)


def truncated_zip(path: str | Path) -> bool:
    """Whether ``path`` is a zip archive (by its name or its first bytes: ``torch.save``'s default
    format) without the end record a complete one has: its writer was killed mid-save."""
    try:
        with open(path, "rb") as f:
            zipped = f.read(4) == ZIP_MAGIC or str(path).lower().endswith(ZIP_SUFFIXES)
        return zipped and not zipfile.is_zipfile(path)
    except OSError:
        return False


@dataclass(frozen=True)
class Known:
    """A recorded, not deleted version of a script's checkpoint file."""

    id: int
    origin: str
    path: str  # where its bytes are: ``origin``, or a copy in the run's folder
    size: int
    mtime: float | None
    verified: bool
    pinned: bool
    refused: bool = False

    def is_version_of(self, f: CheckpointFile) -> bool:
        return self.size == f.size and self.mtime is not None and abs(self.mtime - f.mtime) <= 1e-6


@dataclass
class Plan:
    """What one look at the files changes in the rows.

    Attributes:
        new: Versions to record (stable files no row describes).
        verified: (row id, sha256): recorded versions whose hash is now known.
        overwritten: (row id, the newer file): versions the script wrote over, in place.
        removed: Row ids whose file the script deleted.
    """

    new: list[CheckpointFile] = field(default_factory=list)
    verified: list[tuple[int, str]] = field(default_factory=list)
    overwritten: list[tuple[int, CheckpointFile]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)


def plan_versions(known: Sequence[Known], files: Sequence[CheckpointFile], exists: set[str] | None = None) -> Plan:
    """Compare a look at the files with the recorded versions (pure: the tests call it alone).

    Args:
        known: The run's recorded, not deleted script versions.
        files: What :meth:`CheckpointFiles.scan` returned.
        exists: Origins that still exist on disk though the look did not list them (a look is
            limited to the pattern's matches); None: every unlisted origin is gone.
    """
    plan = Plan()
    listed = {str(f.path): f for f in files}
    for f in files:
        rows = [k for k in known if k.origin == str(f.path)]
        same = next((k for k in rows if k.is_version_of(f)), None)
        if same is not None:
            if not same.verified and not same.refused and f.sha256 is not None:
                plan.verified.append((same.id, f.sha256))
            continue
        if not f.stable:
            continue  # still being written, or just written: recorded at the next look
        plan.new.append(f)
        plan.overwritten += [(k.id, f) for k in rows if k.path == k.origin and not k.pinned]
    for k in known:
        if k.path == k.origin and k.origin not in listed and not k.pinned and k.origin not in (exists or set()):
            plan.removed.append(k.id)
    return plan


def known_versions(session: Session, run_id: int) -> list[Known]:
    rows = session.execute(
        select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.source == SCRIPT,
                                 Checkpoint.deleted.is_(False), Checkpoint.origin.is_not(None))
    ).scalars().all()
    # A version that existed before the run is refused but intact: its hash may still become known.
    return [Known(c.id, str(c.origin), c.path, c.bytes, c.file_mtime, bool(c.verified), bool(c.pinned),
                  c.refused_reason is not None and not c.refused_reason.startswith(PREEXISTING)) for c in rows]


def version_step(session: Session, attempt: Attempt, mtime: float) -> int:
    """The step a new version is recorded at: the newest step ``attempt`` reported at or before
    ``mtime``, else the step it started from (see the module's docstring)."""
    reported = None
    if mtime >= attempt.started_at:
        reported = session.scalar(select(func.max(MetricPoint.step)).where(
            MetricPoint.run_id == attempt.run_id, MetricPoint.attempt == attempt.number,
            MetricPoint.wall_time <= mtime))
    return int(reported) if reported is not None else (attempt.resume_step or 0)


def record_versions(session: Session, run: Run, attempt: Attempt, files: Sequence[CheckpointFile]) -> int:
    """Apply one look at the files to the run's rows (the caller commits). Returns how many new
    versions were recorded. It reads a few bytes of each new file (:func:`truncated_zip`), never
    a whole one: the hashing happened in the look."""
    known = known_versions(session, run.id)
    listed = {str(f.path) for f in files}
    exists = {k.origin for k in known if k.origin not in listed and Path(k.origin).exists()}
    plan = plan_versions(known, files, exists)
    truncated = {str(f.path) for f in plan.new if truncated_zip(f.path)}
    first_start = session.scalar(select(func.min(Attempt.started_at)).where(Attempt.run_id == run.id))
    run_started = min(x for x in (first_start, attempt.started_at) if x is not None)
    now = time.time()
    for f in plan.new:
        broken = TRUNCATED if str(f.path) in truncated else f"{INCOMPLETE}: {f.incomplete}" if f.incomplete else None
        preexisting = f.mtime < run_started
        session.add(Checkpoint(
            run_id=run.id, attempt=attempt.number, path=str(f.path),
            step=f.step if f.step is not None else version_step(session, attempt, f.mtime),
            origin=str(f.path), bytes=f.size, sha256=f.sha256 or "", params_digest="", metrics_json="{}",
            blocked_s=0.0, total_s=0.0, created_at=now, verified=f.sha256 is not None and broken is None,
            pinned=False, deleted=False, source=SCRIPT, file_mtime=f.mtime,
            refused_reason=broken or (_preexisting(session, run, str(f.path), f.size, f.mtime, f.sha256, run_started)
                                      if preexisting else None),
        ))
    for row_id, sha in plan.verified:
        row = session.get(Checkpoint, row_id)
        if row is not None:
            row.sha256, row.verified = sha, True
            if row.refused_reason and row.refused_reason.startswith(PREEXISTING):  # whose, by its bytes now
                row.refused_reason = _preexisting(session, run, str(row.origin), row.bytes, row.file_mtime, sha,
                                                  run_started)
    for row_id, newer in plan.overwritten:
        if str(newer.path) in truncated:
            # Its bytes are gone (the script wrote over them in place) and the new file is unusable.
            _delete(session, row_id, now, f"overwritten by the script at {_clock(newer.mtime)} with a file that is "
                                          f"{TRUNCATED}: neither is usable; a pinned copy or an older version is")
            continue
        _delete(session, row_id, now, f"overwritten by the script at {_clock(newer.mtime)}")
    for row_id in plan.removed:
        _delete(session, row_id, now, "deleted by the script")
    return len(plan.new)


def _preexisting(session: Session, run: Run, origin: str, size: int, mtime: float | None, sha256: str | None,
                 run_started: float) -> str:
    """The refusal of a version that was there before ``run`` started, with whose it probably is:
    the newest other run that recorded the same file (its path, size and time) or the same bytes
    (its sha256), else none runyard knows."""
    same_file = and_(Checkpoint.origin == origin, Checkpoint.bytes == size,
                     Checkpoint.file_mtime.between((mtime or 0) - MTIME_TOLERANCE_S, (mtime or 0) + MTIME_TOLERANCE_S))
    same = or_(same_file, Checkpoint.sha256 == sha256) if sha256 else same_file
    found = session.execute(
        select(Checkpoint.run_id, Checkpoint.step, Checkpoint.origin, Run.name).join(Run, Run.id == Checkpoint.run_id)
        .where(Checkpoint.run_id != run.id, Checkpoint.source == SCRIPT, same,
               # another run that found it there too is no writer of it
               or_(Checkpoint.refused_reason.is_(None), ~Checkpoint.refused_reason.startswith(PREEXISTING)))
        .order_by(Checkpoint.created_at.desc(), Checkpoint.id.desc()).limit(1)).first()
    written = (f"{PREEXISTING} (written at {_clock(mtime or 0)}, before its first attempt began at "
               f"{_clock(run_started)}): not chosen automatically")
    if found is None:
        return f"{written}; written before this run started, by no run runyard knows"
    other, step, other_origin, name = found
    what = "the same file" if other_origin == origin else f"the same bytes (as {other_origin})"
    return f"{written}; probably run {other}'s ({name!r}), which recorded {what} at step {step}"


def _delete(session: Session, row_id: int, now: float, reason: str) -> None:
    row = session.get(Checkpoint, row_id)
    if row is not None:
        row.deleted, row.deleted_at, row.deleted_reason = True, now, reason


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


# -- the next attempt's starting point ---------------------------------------------------------


@dataclass(frozen=True)
class ScriptResume:
    """The file the next attempt starts from: ``RUNYARD_RESUME_PATH``, ``resume_args``."""

    path: str
    step: int
    checkpoint_id: int
    with_args: bool = True  # False: the file is not where the script looks; resume_args are left out


def starting_checkpoint(session: Session, run: Run, number: int) -> Checkpoint | None:
    """The checkpoint attempt ``number`` of ``run`` starts from, of either kind, before any check
    of its files: the one a resume request names; else, for a retry, the run's newest verified
    checkpoint of runyard's own (``checkpoints/step-<N>/``), else its newest intact script version
    that was not refused; else (a first attempt, or a retry before the run saved anything) a fork's
    origin; else none (from scratch, or a rerun). The scheduler's launch
    (orchestrator/scheduler/attempts.py) and the words of a retry's alert both read it here."""
    if run.start_fresh:
        return None
    if run.resume_checkpoint_id is not None:
        return session.get(Checkpoint, run.resume_checkpoint_id)
    if number > 1:
        own = session.execute(
            select(Checkpoint)
            .where(Checkpoint.run_id == run.id, Checkpoint.verified.is_(True), Checkpoint.deleted.is_(False),
                   Checkpoint.path.like(f"{checkpoints_dir(run)}/step-%"))
            .order_by(Checkpoint.step.desc(), Checkpoint.id.desc())
            .limit(1)
        ).scalar_one_or_none()
        newest = own if own is not None else newest_intact(session, run.id)
        if newest is not None:
            return newest
    if run.parent_checkpoint_id is not None:
        return session.get(Checkpoint, run.parent_checkpoint_id)
    return None


def chosen_row(session: Session, run: Run, number: int) -> Checkpoint | None:
    """The script checkpoint the attempt ``number`` of ``run`` should start from, before checks
    (:func:`starting_checkpoint`, when it is a script's version); None when runyard's own
    checkpoints apply or there is none."""
    row = starting_checkpoint(session, run, number)
    return row if row is not None and row.source == SCRIPT else None


def resume_point(session: Session, run: Run, number: int) -> ScriptResume | None:
    """Where attempt ``number`` of a script run starts: a verified script checkpoint version that
    is still intact, put where the script finds it, or None (from scratch, or runyard's own
    checkpoints apply). Events say what was substituted or moved. The caller commits.

    Call it before the transaction's first write: it copies files (gigabytes) and queues its
    events and row changes without flushing them, so the write lock is taken only afterwards."""
    with session.no_autoflush:
        return _resume_point(session, run, number)


def _resume_point(session: Session, run: Run, number: int) -> ScriptResume | None:
    row = chosen_row(session, run, number)
    if row is None:
        return None
    if not is_version(row.path, row.bytes, row.file_mtime):
        newer = newest_intact(session, row.run_id, row.origin)
        what = f"checkpoint {row.id} ({row.origin}, step {row.step})"
        if newer is None:
            _event(session, run, number, "warning",
                   f"{what} is not the recorded version any more (the script overwrote or deleted it) and no other "
                   "recorded version of it is intact: the attempt starts without a checkpoint")
            return None
        _event(session, run, number, "warning",
               f"{what} was overwritten by the script; starting from the newest recorded version of it instead: "
               f"checkpoint {newer.id}, step {newer.step}")
        row = newer
    path, placed = _put_in_place(session, run, number, row)
    return ScriptResume(path=path, step=row.step, checkpoint_id=row.id, with_args=placed)


def _put_in_place(session: Session, run: Run, number: int, row: Checkpoint) -> tuple[str, bool]:
    """Make the script find ``row``'s version where it looks (``origin``'s path under this run's
    workdir), keeping what lies there; returns the path handed to the script and whether the
    script's ``resume_args`` apply. When it has no place (no relative path), the verified bytes'
    own path is handed over. When putting it there fails, the script would load whatever lies
    there with its ``resume_args``: the attempt starts without them (RUNYARD_RESUME_PATH still
    names the verified bytes, for a script that reads it), and an event says so."""
    writer = run if row.run_id == run.id else session.get(Run, row.run_id)
    if row.origin is None or writer is None:
        return row.path, True
    try:
        relative = Path(row.origin).relative_to(workdir_of(writer))
    except ValueError:
        return row.path, True
    target = workdir_of(run) / relative
    if str(target) == row.path or is_version(target, row.bytes, row.file_mtime):
        return str(target), True
    try:
        _keep_aside(session, run, number, target)
        copy_verified(row.path, target, row.sha256, row.file_mtime)
    except (CopyRefused, OSError) as exc:
        _event(session, run, number, "warning",
               f"could not put checkpoint {row.id} (step {row.step}) at {target}: {exc}; the attempt starts "
               f"without workload.resume_args (the script would load another file); RUNYARD_RESUME_PATH names "
               f"{row.path}")
        return row.path, False
    _event(session, run, number, "info", f"put checkpoint {row.id} (step {row.step}) back at {target} for the script")
    return str(target), True


def _keep_aside(session: Session, run: Run, number: int, target: Path) -> None:
    """Before ``target`` is replaced: a recorded version there is copied into its run's folder
    (its row follows the copy); an unrecorded file is renamed beside it."""
    if not target.exists():
        return
    st = target.stat()
    for row in session.execute(select(Checkpoint).where(
            Checkpoint.source == SCRIPT, Checkpoint.deleted.is_(False), Checkpoint.path == str(target))).scalars():
        if is_version(target, row.bytes, row.file_mtime) and row.verified:
            keep_copy(session, row)
            _event(session, run, number, "info", f"kept checkpoint {row.id} (step {row.step}) at {row.path} "
                                                 f"before replacing {target}")
            return
    aside = target.with_name(f"{target.name}.before-attempt-{number}")
    n = 1
    while aside.exists() or aside.is_symlink():  # an earlier aside of the same attempt number (a rerun)
        n += 1
        aside = target.with_name(f"{target.name}.before-attempt-{number}.{n}")
    target.rename(aside)
    _event(session, run, number, "warning", f"moved the unrecorded file {target} ({st.st_size} bytes) to {aside} "
                                            "before putting the chosen checkpoint there")


def _event(session: Session, run: Run, number: int, level: str, message: str) -> None:
    logger.info("run %d attempt %d: %s", run.id, number, message)
    session.add(Event(run_id=run.id, attempt=number, at=time.time(), level=level, kind="resume", message=message))
