"""Requests the UI and the CLI write: a new QUEUED run, a cancel. They never touch processes;
the scheduler acts on what they write."""

from __future__ import annotations

import json
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from db import DatabaseError
from db.file_versions import CopyRefused, copy_verified, is_version
from db.models import Attempt, Checkpoint, Event, PriceEntry, Run, RunStatusHistory
from db.states import ACTIVE, RESUMABLE, STOPPING, TERMINAL, RunStatus, transition
from db.vocabulary.config import RunConfig, ScriptWorkload, config_from_json, write_config_file
from db.vocabulary.cost import Price
from db.vocabulary.layout import RunPaths, run_dir_name


class RunNotFound(DatabaseError):
    """No run matches the reference a person gave."""


class RequestRefused(DatabaseError):
    """A request that cannot be carried out in the run's current state; the message says what
    to do instead."""


SCRIPT_SOURCE = "script"  # checkpoints.source of a file the script wrote itself
# refused_reason of a script version whose file was there before the run's first attempt started
# (a previous experiment's file in a shared workdir): listed, never chosen automatically.
PREEXISTING = "existed before the run started"


def newest_intact(session: Session, run_id: int, origin: str | None = None) -> Checkpoint | None:
    """The newest verified, not deleted, not refused script version of a run (of one file) whose
    bytes are still the recorded version: what a retry or a pause's Resume starts from."""
    q = select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.source == SCRIPT_SOURCE,
                                 Checkpoint.verified.is_(True), Checkpoint.deleted.is_(False),
                                 Checkpoint.refused_reason.is_(None))
    if origin is not None:
        q = q.where(Checkpoint.origin == origin)
    for row in session.execute(q.order_by(Checkpoint.file_mtime.desc(), Checkpoint.id.desc())).scalars():
        if is_version(row.path, row.bytes, row.file_mtime):
            return row
    return None


def checkpoints_dir(run: Run) -> Path:
    return RunPaths(Path(run.run_dir)).checkpoints



def create_run(
    session: Session, config: RunConfig, runs_dir: Path, price: Price, *, parent: Checkpoint | None = None
) -> Run:
    """Insert a QUEUED run and write its config.json; the caller commits.

    With ``parent`` (a fork), the run's first attempt starts from that checkpoint.
    """
    now = time.time()
    run = Run(
        name=config.name,
        status=RunStatus.QUEUED.value,
        status_reason="submitted",
        config_json=config.to_json(),
        config_hash=config.config_hash(),
        tags_json=json.dumps(list(config.tags)),
        max_steps=config.workload.max_steps if config.workload.kind == "script" else config.train.max_steps,
        nproc=config.launch.world_size,  # every rank, on all nodes
        executor=config.launch.executor,
        price_usd_per_hour=price.usd_per_hour,
        price_unit=price.unit,
        created_at=now,
        updated_at=now,
    )
    if parent is not None:
        run.parent_run_id = parent.run_id
        run.parent_step = parent.step
        run.parent_checkpoint_id = parent.id
    session.add(run)
    session.flush()
    run_dir = runs_dir / run_dir_name(run.id)
    run.run_dir = str(run_dir)
    session.add(
        RunStatusHistory(run_id=run.id, from_status=None, to_status=run.status, reason="submitted", at=now)
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config_file(RunPaths(run_dir).config, config)
    return run


def request_cancel(session: Session, run_id: int, who: str = "user", mode: str = "cancel") -> str:
    """Ask for a run to be cancelled (or paused); the caller commits.

    A queued or retrying run is cancelled at once (no process to stop); an active one moves to
    CANCELLING (PAUSING for a pause) and the scheduler stops its processes: SIGTERM, the ranks finish the step and
    write a checkpoint, SIGKILL after the grace period. A paused run ends PAUSED with that
    checkpoint, and Resume continues from it; cancelling a PAUSED run ends it CANCELLED.

    Returns:
        A sentence for the person saying what happened.
    """
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(f"run {run_id} does not exist")
    status = RunStatus(run.status)
    if status in RESUMABLE and mode == "cancel":
        word = status.value.lower()
        if not transition(session, run_id, RunStatus.CANCELLED, f"cancelled by {who} while {word}", expect=status):
            return f"run {run_id} changed status meanwhile; look again with `runyard show {run_id}`"
        session.add(Event(run_id=run_id, at=time.time(), kind="cancel", message=f"cancelled by {who} while {word}"))
        return f"run {run_id} cancelled (it was {word}; it can still be resumed from its checkpoints)"
    if status in TERMINAL:
        return f"run {run_id} is already {status.value}; nothing to {mode}"
    if status is RunStatus.PAUSING and mode == "cancel":
        # A cancel while the pause is carried out: the same stop, ending CANCELLED instead of PAUSED.
        run.stop_mode = mode
        if not transition(session, run_id, RunStatus.CANCELLING, f"cancel requested by {who} while pausing",
                          expect=RunStatus.PAUSING):
            return f"run {run_id} changed status meanwhile; look again with `runyard show {run_id}`"
        session.add(Event(run_id=run_id, at=time.time(), kind=mode, message=f"cancel requested by {who} while pausing"))
        return f"run {run_id}: cancel requested (it was pausing; it ends CANCELLED instead of PAUSED)"
    resume_from = pause_resume_point(session, run) if mode == "pause" and status not in STOPPING else ""
    if status in (RunStatus.QUEUED, RunStatus.RETRYING):
        word = "paused" if mode == "pause" else "cancelled"
        moved = transition(session, run_id, RunStatus.PAUSED if mode == "pause" else RunStatus.CANCELLED,
                           f"{word} by {who} before launch")
    elif status in ACTIVE and status not in STOPPING:
        run.stop_mode = mode
        moved = transition(session, run_id, RunStatus.PAUSING if mode == "pause" else RunStatus.CANCELLING,
                           f"{mode} requested by {who}")
    else:
        return f"run {run_id} is already being stopped ({status.value})"
    if not moved:
        return f"run {run_id} changed status meanwhile; look again with `runyard show {run_id}`"
    session.add(Event(run_id=run_id, at=time.time(), kind=mode, message=f"{mode} requested by {who}"))
    return f"run {run_id}: {mode} requested" + (f"; {resume_from}" if resume_from else "")


def pause_resume_point(session: Session, run: Run) -> str:
    """For a pause: what Resume will start from, in words ("" when runyard's own checkpoints
    apply). A plain script run without a checkpoint source cannot be paused.

    Raises:
        RequestRefused: the run is a script with no ``workload.checkpoint_glob`` and no checkpoint
            written through the SDK: stopping it would leave nothing to resume from.
    """
    workload = config_from_json(run.config_json).workload
    if workload.kind != "script":
        return ""
    sdk = session.scalar(select(Checkpoint.id).where(Checkpoint.run_id == run.id, Checkpoint.source != SCRIPT_SOURCE)
                         .limit(1))
    if sdk is not None:
        return ""
    newest = newest_intact(session, run.id)
    if newest is not None:
        return (f"Resume will start from {newest.origin or newest.path} as written at step {newest.step} "
                f"(checkpoint {newest.id}); what the script did after it is redone")
    recorded = session.execute(
        select(Checkpoint).where(Checkpoint.run_id == run.id, Checkpoint.source == SCRIPT_SOURCE,
                                 Checkpoint.verified.is_(True), Checkpoint.deleted.is_(False),
                                 Checkpoint.refused_reason.is_(None))
        .order_by(Checkpoint.file_mtime.desc(), Checkpoint.id.desc()).limit(1)
    ).scalar_one_or_none()
    if recorded is not None:  # the script is rewriting it right now: its next version is recorded as it stops
        return (f"Resume will start from the newest version of {recorded.origin or recorded.path} recorded when the "
                f"script stops (the one recorded at step {recorded.step}, checkpoint {recorded.id}, is being "
                "rewritten); what the script did after it is redone")
    if workload.checkpoint_glob:
        return (f"no file matching workload.checkpoint_glob = {workload.checkpoint_glob!r} has been recorded yet: "
                "Resume needs one; the script's files written before it stops are still recorded")
    raise RequestRefused(
        f"run {run.id} is a plain script with no checkpoint source: pausing would stop it with nothing to resume "
        "from. Set workload.checkpoint_glob to the file(s) the script saves (with workload.resume_args if it needs "
        "a flag to load them), or save through the SDK (run.save_checkpoint, or run.adopt_checkpoint for a file it "
        f"writes itself). To stop it anyway: `runyard cancel {run.id}`; `runyard rerun {run.id}` starts it again "
        "in its folder later")


def request_stack_dump(session: Session, run_id: int) -> str:
    """Ask the scheduler to save every rank's Python stack (nothing is stopped)."""
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(f"run {run_id} does not exist")
    if RunStatus(run.status) not in (RunStatus.STARTING, RunStatus.RUNNING):
        raise RequestRefused(f"run {run_id} is {run.status}: only a running run has stacks to dump")
    run.dump_requested_at = time.time()
    return f"run {run_id}: stack dump requested; the files appear under the attempt's stacks/ folder"


def usable_checkpoint(
    session: Session, run_id: int, step: int | None = None, checkpoint_id: int | None = None, verb: str = "resume"
) -> Checkpoint:
    """A verified, not deleted checkpoint of a run: by id, by step (the newest written at that
    step), or the newest of all. By step and as the newest, only the run's own count: a version
    refused as not the run's own (a file that was in the working folder before the run started, a
    version a retry failed to load) is started from only when a person names it by id.

    Args:
        verb: The command the refusal's hint names (``runyard resume`` or ``runyard fork``).

    Raises:
        RequestRefused: no such checkpoint; the message names the versions a person may name instead.
    """
    usable = (Checkpoint.run_id == run_id, Checkpoint.verified.is_(True), Checkpoint.deleted.is_(False))
    own = Checkpoint.refused_reason.is_(None)
    q = select(Checkpoint).where(*usable)
    if checkpoint_id is not None:
        q = q.where(Checkpoint.id == checkpoint_id)
    else:
        q = q.where(own) if step is None else q.where(own, Checkpoint.step == step)
    found = session.execute(q.order_by(Checkpoint.step.desc(), Checkpoint.id.desc()).limit(1)).scalar_one_or_none()
    if found is not None:
        return found
    steps = sorted(set(session.scalars(select(Checkpoint.step).where(*usable, own)).all()))
    listed = ", ".join(map(str, steps)) or "none"
    if checkpoint_id is not None:
        named = session.get(Checkpoint, checkpoint_id)
        why = (f": {named.refused_reason}" if named is not None and named.run_id == run_id and named.refused_reason
               else "")
        raise RequestRefused(f"checkpoint {checkpoint_id} of run {run_id} is deleted or not verified{why}; "
                             f"verified steps: {listed}")
    refused = session.execute(select(Checkpoint).where(*usable, Checkpoint.refused_reason.is_not(None),
                                                       *((Checkpoint.step == step,) if step is not None else ()))
                              .order_by(Checkpoint.step.desc(), Checkpoint.id.desc()).limit(3)).scalars().all()
    others = "".join(f"; checkpoint {c.id} ({c.origin or c.path}, step {c.step}) is not: {c.refused_reason}. To "
                     f"start from it anyway, name it: `runyard {verb} {run_id} --checkpoint {c.id}`" for c in refused)
    if step is not None:
        raise RequestRefused(f"run {run_id} has no verified checkpoint of its own at step {step}; its verified "
                             f"steps: {listed}{others}")
    raise RequestRefused(f"run {run_id} has no verified checkpoint of its own to start from{others}")


def request_resume(
    session: Session, run_id: int, step: int | None = None, who: str = "user", checkpoint_id: int | None = None
) -> int:
    """Queue a finished run again; its next attempt starts from a checkpoint: ``checkpoint_id``,
    else the one at ``step``, else the newest verified one. The caller commits.

    Returns:
        The step the run will resume from.
    """
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(f"run {run_id} does not exist")
    status = RunStatus(run.status)
    if status in STOPPING:
        raise RequestRefused(
            f"run {run_id} is being stopped ({status.value}); wait until it is PAUSED or CANCELLED, then resume"
        )
    if status not in TERMINAL:
        raise RequestRefused(
            f"run {run_id} is {status.value}; cancel it first (`runyard cancel {run_id}`), then resume"
        )
    never_started = session.scalar(select(Attempt.id).where(Attempt.run_id == run_id).limit(1)) is None
    if status in RESUMABLE and never_started and step is None and checkpoint_id is None:
        # paused (or pruned) while QUEUED: held back, now let go; it starts as it would have (a fork from its origin)
        run.resume_checkpoint_id = None
        run.retries_used = 0
        word = status.value.lower()
        if not transition(session, run_id, RunStatus.QUEUED, f"resume of a run {word} before it started, by {who}"):
            raise RequestRefused(f"run {run_id} changed status meanwhile; try again")
        session.add(Event(run_id=run_id, at=time.time(), kind="resume",
                          message=f"queued again from the start by {who} (it was {word} before it started)"))
        return 0
    checkpoint = usable_checkpoint(session, run_id, step, checkpoint_id)
    run.resume_checkpoint_id = checkpoint.id
    run.start_fresh = False
    run.retries_used = 0  # a person chose to go on: a fresh retry budget
    if not transition(session, run_id, RunStatus.QUEUED, f"resume from step {checkpoint.step} requested by {who}"):
        raise RequestRefused(f"run {run_id} changed status meanwhile; try again")
    session.add(Event(run_id=run_id, at=time.time(), kind="resume",
                      message=f"resume from step {checkpoint.step} requested by {who}"))
    return checkpoint.step


def set_pinned(session: Session, run_id: int, step: int, pinned: bool, checkpoint_id: int | None = None) -> None:
    """Pin (keep forever) or unpin a checkpoint of a run (by id, or the newest at ``step``);
    the caller commits."""
    q = select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.deleted.is_(False))
    q = q.where(Checkpoint.id == checkpoint_id) if checkpoint_id is not None else q.where(Checkpoint.step == step)
    checkpoint = session.execute(q.order_by(Checkpoint.id.desc()).limit(1)).scalar_one_or_none()
    if checkpoint is None:
        what = f"checkpoint {checkpoint_id}" if checkpoint_id is not None else f"a checkpoint at step {step}"
        raise RequestRefused(f"run {run_id} has no {what} (or it was deleted)")
    if pinned:
        pin_script_copy(session, checkpoint)
    checkpoint.pinned = pinned


def pin_script_copy(session: Session, checkpoint: Checkpoint) -> None:
    """A script's own checkpoint file is pinned by copying it into the run's folder, where the
    script cannot overwrite it (sha256 verified; the row then points at the copy). Unpinning
    leaves the copy. Runyard's own checkpoints need no copy.

    Raises:
        RequestRefused: the file is not the recorded, verified version any more.
    """
    if checkpoint.source != SCRIPT_SOURCE or checkpoint.path != checkpoint.origin:
        return
    if not checkpoint.verified:
        raise RequestRefused(f"checkpoint {checkpoint.id} ({checkpoint.path}) is not verified yet (its sha256 is "
                             "computed once the file stops changing); pin it in a moment")
    try:
        keep_copy(session, checkpoint)
    except CopyRefused as exc:
        raise RequestRefused(f"cannot pin checkpoint {checkpoint.id}: {exc}") from exc


def keep_copy(session: Session, row: Checkpoint) -> None:
    """Copy a script checkpoint version's bytes into its run's folder
    (``checkpoints/script/<id>/<name>``, sha256 verified, atomically) and point the row at the copy.

    Raises:
        CopyRefused: the file is not the recorded version any more.
    """
    owner = session.get(Run, row.run_id)
    if owner is None:
        raise CopyRefused(f"run {row.run_id} of checkpoint {row.id} does not exist")
    target = RunPaths(Path(owner.run_dir)).script_copy(row.id, Path(row.origin or row.path).name)
    copy_verified(row.path, target, row.sha256, row.file_mtime)
    row.path = str(target)


IMPORTED_TAG = "imported"


def workdir_of(run: Run, config: RunConfig | None = None) -> Path:
    """Where a script run's ranks run: its ``workload.workdir``, else the run's own folder."""
    workload = (config or config_from_json(run.config_json)).workload
    return Path(workload.workdir if isinstance(workload, ScriptWorkload) and workload.workdir else run.run_dir)


def imported(run: Run) -> bool:
    """Whether ``run`` holds the metrics of a past run brought in by ``runyard import
    tensorboard``: tagged so, and its "script" is the folder it was read from."""
    config = config_from_json(run.config_json)
    workload = config.workload
    return (IMPORTED_TAG in config.tags and isinstance(workload, ScriptWorkload) and workload.script is not None
            and not workload.script.endswith(".py"))


def request_rerun(session: Session, run_id: int, who: str = "user") -> str:
    """Queue a finished script run again without a checkpoint: a new attempt in the same working
    directory, for a script that keeps its own state there. The caller commits.

    Returns:
        A sentence for the person.
    """
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(f"run {run_id} does not exist")
    status = RunStatus(run.status)
    if status not in TERMINAL:
        raise RequestRefused(
            f"run {run_id} is {status.value}: only a finished run can be rerun; stop it first "
            f"(`runyard cancel {run_id}`) and rerun it once it is CANCELLED or PAUSED")
    workload = config_from_json(run.config_json).workload
    if workload.kind != "script":
        raise RequestRefused(f"run {run_id} runs the built-in workload {workload.kind!r}, which keeps no state of its "
                             f"own: resume it from a checkpoint (`runyard resume {run_id}`) or fork it instead")
    if imported(run):
        raise RequestRefused(f"run {run_id} was imported from {workload.script} (`runyard import tensorboard`): "
                             "it holds past metrics and has no script to run")
    run.resume_checkpoint_id = None
    run.start_fresh = True
    run.retries_used = 0
    if not transition(session, run_id, RunStatus.QUEUED, f"rerun requested by {who}"):
        raise RequestRefused(f"run {run_id} changed status meanwhile; try again")
    where = workdir_of(run)
    message = f"rerun requested by {who}: a new attempt in {where}, without a checkpoint"
    session.add(Event(run_id=run_id, at=time.time(), kind="rerun", message=message))
    return f"run {run_id} queued to run again in {where} (no checkpoint: the script starts from its own state there)"


def set_prices(session: Session, prices: dict[str, float]) -> None:
    """Replace the price table (USD per hour); runs already submitted keep their price."""
    bad = [f"{device!r} = {value!r}" for device, value in prices.items()
           if not device.strip() or not isinstance(value, (int, float)) or value != value or value < 0]
    if bad:
        raise RequestRefused(f"prices must be non-negative numbers with a device name: {', '.join(bad)}")
    now = time.time()
    session.query(PriceEntry).delete()
    session.add_all(PriceEntry(device=d.strip(), usd_per_hour=float(v), updated_at=now) for d, v in prices.items())
