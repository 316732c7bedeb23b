"""What a person changes about a run after submit, the same for the UI and the CLI: its name, tags
and note (``runyard edit``, the Run page's Edit…), its star and archive mark (``runyard star``,
``runyard archive``, the Runs list), and deleting it with its files (``runyard rm``, the Runs
list's Delete…).

Every change is validated first, all problems reported together, each naming the field and the
value; each change is kept as an ``edit`` event of the run (who, what, from what), which the Run
page's events and ``runyard show`` list. The name, a tag and the note follow the rules a config's
``name`` and ``tags`` follow too (db/vocabulary/config/labels.py). The run's config stays as
submitted (its ``name`` and ``tags`` there are what it was launched with); the run row holds what
the person calls it now.

Deleting is refused for a run that is not finished (cancel it first) and for one whose checkpoint
a queued or running fork still needs; :func:`deletion_plan` says beforehand what would go,
pinned checkpoints named, so that the UI and the CLI can ask for a confirmation that names them.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select
from sqlalchemy.orm import Session

from db.models import Checkpoint, Event, Run
from db.requests import RequestRefused, RunNotFound
from db.states import TERMINAL, RunStatus
from db.vocabulary.config.labels import TAGS_MAX, name_problem, note_problem, tag_problem

logger = logging.getLogger(__name__)

EDIT_EVENT = "edit"


class EditRefused(RequestRefused):
    """An edit, star, archive or delete that cannot be done as asked; the message says why."""


class EditValueRefused(EditRefused):
    """An edit refused for what was asked (a name, a tag, a note): bad input, not the run's state."""


def _run(session: Session, run_id: int) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(f"no run with id {run_id}; `runyard ls` lists the runs")
    return run


def _event(session: Session, run_id: int, message: str, now: float) -> None:
    session.add(Event(run_id=run_id, at=now, kind=EDIT_EVENT, message=message))


@dataclass(frozen=True)
class Labels:
    """What a person calls a run: its name, tags and note."""

    name: str
    tags: tuple[str, ...]
    note: str | None


@dataclass(frozen=True)
class EditRequest:
    """What a person asked to change (None and empty: unchanged; ``note=""``: cleared)."""

    name: str | None = None
    add_tags: tuple[str, ...] = ()
    remove_tags: tuple[str, ...] = ()
    note: str | None = None  # as typed: its line breaks and ends are tidied (:func:`note_text`)


class Change(Enum):
    """One change an edit makes; the value is its sentence, filled in (:func:`edit_changes`)."""

    RENAMED = "renamed {old!r} to {new!r}"
    TAG_REMOVED = "tag {tag!r} removed"
    TAG_ADDED = "tag {tag!r} added"
    NOTE_SET = "note set: {note!r}"
    NOTE_CLEARED = "note cleared"


def note_text(note: str | None) -> str | None:
    """A note as kept: Unix line breaks, no blank ends (None: unchanged; empty: cleared)."""
    return None if note is None else note.replace("\r\n", "\n").strip()


def edit_problems(run_id: int, now: Labels, asked: EditRequest) -> list[str]:
    """Every problem with ``asked`` for run ``run_id`` labelled ``now``, each naming the value
    (the rules of db/vocabulary/config/labels.py); empty when the edit may be made."""
    problems = []
    if asked.name is not None and (problem := name_problem(asked.name)):
        problems.append(problem)
    problems += [p for t in asked.add_tags if (p := tag_problem(t))]
    if missing := [t for t in asked.remove_tags if t not in now.tags]:
        problems.append(f"remove tag {missing[0]!r}: run {run_id} has no such tag (its tags: "
                        f"{', '.join(now.tags) or 'none'})")
    if both := sorted(set(asked.add_tags) & set(asked.remove_tags)):
        problems.append(f"tag {both[0]!r} is both added and removed; ask for one")
    if (count := len(_tags_after(now, asked))) > TAGS_MAX:
        problems.append(f"tags: a run holds at most {TAGS_MAX}; run {run_id} would have {count}")
    if (text := note_text(asked.note)) is not None and (problem := note_problem(text)):
        problems.append(problem)
    return problems


def _tags_after(now: Labels, asked: EditRequest) -> tuple[str, ...]:
    """The run's tags after the edit: its own in their order less those removed, then those added."""
    kept = [t for t in now.tags if t not in asked.remove_tags]
    return (*kept, *(t for t in dict.fromkeys(asked.add_tags) if t not in kept))


def edit_changes(now: Labels, asked: EditRequest) -> tuple[Labels, list[str]]:
    """The run's labels after an edit :func:`edit_problems` found nothing wrong with, and one
    sentence per change it makes (a :class:`Change` filled in), in order: the name, the tags
    removed, the tags added, the note."""
    done = []
    if asked.name is not None and asked.name != now.name:
        done.append(Change.RENAMED.value.format(old=now.name, new=asked.name))
    tags = _tags_after(now, asked)
    done += [Change.TAG_REMOVED.value.format(tag=t) for t in now.tags if t in asked.remove_tags]
    done += [Change.TAG_ADDED.value.format(tag=t) for t in tags if t not in now.tags]
    text, note = note_text(asked.note), now.note
    if text is not None and (text or None) != now.note:
        done.append(Change.NOTE_SET.value.format(note=text) if text else Change.NOTE_CLEARED.value)
        note = text or None
    return Labels(now.name if asked.name is None else asked.name, tags, note), done


def edit_run(session: Session, run_id: int, *, name: str | None = None, add_tags: Sequence[str] = (),
             remove_tags: Sequence[str] = (), note: str | None = None, who: str = "user") -> list[str]:
    """Rename a run, add or remove tags, set or clear (``note=""``) its note; the caller commits.

    Args:
        session: Where to write.
        run_id: The run.
        name: The new name (None: unchanged).
        add_tags: Tags to add (one the run has already is left as it is).
        remove_tags: Tags to remove; each must be one of the run's.
        note: The new note (None: unchanged; blank: cleared).
        who: Who asks ("ui", "cli"), recorded in each change's event.

    Returns:
        One sentence per change made (empty when nothing changed).

    Raises:
        RunNotFound: no such run.
        EditValueRefused: a problem with what was asked; every problem in one message.
    """
    run = _run(session, run_id)
    now = Labels(run.name, tuple(json.loads(run.tags_json or "[]")), run.note)
    asked = EditRequest(name, tuple(add_tags), tuple(remove_tags), note)
    if problems := edit_problems(run_id, now, asked):
        raise EditValueRefused(f"run {run_id} not changed: " + "; ".join(problems))
    after, done = edit_changes(now, asked)
    _relabel(session, run, now, after, [f"{change} by {who}" for change in done])
    return done


def _relabel(session: Session, run: Run, now: Labels, after: Labels, events: list[str]) -> None:
    """Write ``after`` on the run where it differs from ``now``, with one event per change."""
    at = time.time()
    if after.name != now.name:
        run.name = after.name
    if after.tags != now.tags:
        run.tags_json = json.dumps(list(after.tags))
    if after.note != now.note:
        run.note = after.note
    for message in events:
        _event(session, run.id, message, at)
    if events:
        run.updated_at = at


def set_starred(session: Session, run_id: int, starred: bool, who: str = "user") -> str:
    """Star or unstar a run; the caller commits. Returns a sentence."""
    run = _run(session, run_id)
    word = "starred" if starred else "unstarred"
    if bool(run.starred) != starred:
        run.starred = starred
        _event(session, run_id, f"{word} by {who}", time.time())
    return f"run {run_id} {word}"


def set_archived(session: Session, run_id: int, archived: bool, who: str = "user") -> str:
    """Archive a run (hidden from the Runs list and `runyard ls` unless asked for) or bring it
    back; the caller commits. A run that is not finished stays in view: it is refused.

    Raises:
        EditRefused: archiving a run that has not finished.
    """
    run = _run(session, run_id)
    status = RunStatus(run.status)
    if archived and status not in TERMINAL:
        raise EditRefused(f"run {run_id} is {status.value}: only a finished run can be archived; cancel it first "
                          f"(`runyard cancel {run_id}`) or wait until it ends")
    word = "archived" if archived else "unarchived"
    if bool(run.archived) != archived:
        run.archived = archived
        _event(session, run_id, f"{word} by {who}", time.time())
    return f"run {run_id} {word}" + (" (hidden from the list; `runyard ls --archived` shows it)" if archived else "")


@dataclass(frozen=True)
class DeletionPlan:
    """What deleting a run would remove, and why it cannot be deleted (``refused``), if so."""

    run_id: int
    name: str
    status: str
    run_dir: str
    checkpoints: int  # checkpoints whose files are still there
    pinned: list[dict[str, Any]] = field(default_factory=list)  # {"id", "step", "path"} of each pinned one
    refused: str | None = None

    def confirmation(self) -> str:
        """The sentence a person confirms: what goes, pinned checkpoints named."""
        parts = [f"Delete run #{self.run_id} {self.name} ({self.status}): its database rows (attempts, metrics, "
                 f"events) and its folder {self.run_dir}, with {self.checkpoints} checkpoint(s)."]
        if self.pinned:
            listed = ", ".join(f"#{c['id']} at step {c['step']}" for c in self.pinned)
            parts.append(f"{len(self.pinned)} pinned checkpoint(s) go too: {listed}.")
        parts.append("This cannot be undone.")
        return " ".join(parts)


def deletion_plan(session: Session, run_id: int) -> DeletionPlan:
    """What :func:`delete_run` would remove; ``refused`` says why it would not (the run is not
    finished, or a fork that has not started yet still needs one of its checkpoints)."""
    run = _run(session, run_id)
    kept = session.execute(
        select(Checkpoint.id, Checkpoint.step, Checkpoint.path, Checkpoint.pinned)
        .where(Checkpoint.run_id == run_id, Checkpoint.deleted.is_(False)).order_by(Checkpoint.step)
    ).all()
    pinned = [{"id": c.id, "step": c.step, "path": c.path} for c in kept if c.pinned]
    status = RunStatus(run.status)
    refused = None
    if status not in TERMINAL:
        refused = (f"run {run_id} is {status.value}: cancel it first (`runyard cancel {run_id}`, or Cancel on its "
                   "page), then delete it")
    else:
        fork = session.execute(
            select(Run.id, Run.status).where(Run.parent_run_id == run_id,
                                              Run.status.not_in([s.value for s in TERMINAL])).limit(1)
        ).first()
        if fork is not None:
            refused = (f"run {fork.id} ({fork.status}) was forked from run {run_id} and may still start from its "
                       f"checkpoint: let it finish or cancel it first")
    return DeletionPlan(run_id=run_id, name=run.name, status=run.status, run_dir=run.run_dir,
                        checkpoints=len(kept), pinned=pinned, refused=refused)


def delete_run(session: Session, run_id: int, runs_dir: Path, who: str = "user") -> str:
    """Delete a finished run: its rows (attempts, checkpoints, metrics, events, alerts go with it)
    and then its folder under ``runs_dir``. Commits the deletion itself (the folder is removed
    only once the rows are gone, so a run is never left without its files).

    A folder outside ``runs_dir`` (a database brought from elsewhere) is left, and the sentence
    says so; a script's own files in its working directory are never runyard's to delete.

    Returns:
        A sentence saying what was removed.

    Raises:
        EditRefused: as :func:`deletion_plan` refuses, or the run changed status meanwhile.
    """
    plan = deletion_plan(session, run_id)
    if plan.refused:
        raise EditRefused(plan.refused)
    result = cast(CursorResult[Any], session.execute(
        delete(Run).where(Run.id == run_id, Run.status.in_([s.value for s in TERMINAL]))
        .execution_options(synchronize_session=False)))
    if result.rowcount != 1:
        session.rollback()
        raise EditRefused(f"run {run_id} changed status meanwhile (resumed?); look again with `runyard show {run_id}`")
    session.commit()
    logger.info("run %s (%s) deleted by %s", run_id, plan.name, who)
    folder = Path(plan.run_dir) if plan.run_dir else None
    pinned = f", {len(plan.pinned)} pinned checkpoint(s) with it" if plan.pinned else ""
    if folder is None or not folder.exists():
        return f"run {run_id} deleted{pinned} (its folder was already gone)"
    if not folder.resolve().is_relative_to(runs_dir.resolve()):
        return f"run {run_id} deleted{pinned}; its folder {folder} is outside {runs_dir} and was left"
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        return f"run {run_id} deleted{pinned}, but its folder {folder} could not be removed entirely: {exc}"
    return f"run {run_id} deleted with its folder {folder}{pinned}"
