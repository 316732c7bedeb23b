"""A managed run's checkpoints in the database: their records, events, the resume point, and the
retention policy (trainer/checkpoint/retention.py) applied as they arrive.

Rank 0's database writer thread records every durable checkpoint, then applies retention:
keep the last N, the best K by a metric, and every pinned one; never the only verified one.
Deleted checkpoints stay in the history, marked deleted with the reason.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from db.vocabulary.config import CheckpointConfig
from trainer.checkpoint.manager import CheckpointManager
from trainer.checkpoint.retention import CheckpointInfo, select_kept
from trainer.checkpoint.writing import SaveResult
from trainer.reporting.reporter import DatabaseWriter

if TYPE_CHECKING:
    from sqlalchemy import Connection

# SQLAlchemy and the models are imported where the writer thread uses them: a rank that never
# writes (every rank but 0) does not pay for them at start-up, and rank 0 pays on that thread.

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdoptedFile:
    """A checkpoint file the script wrote itself, hashed by rank 0 (``Run.adopt_checkpoint``)."""

    path: str
    step: int
    size: int
    mtime: float
    sha256: str
    hash_s: float
    at: float


class CheckpointHistory:
    """Writes checkpoint records and events for one attempt, from the database writer thread."""

    def __init__(self, run_id: int, attempt: int, config: CheckpointConfig, manager: CheckpointManager):
        self.run_id = run_id
        self.attempt = attempt
        self.config = config
        self.manager = manager
        self._unranked_said = False  # keep_best's metric missing from every checkpoint: said once

    def attach(self, writer: DatabaseWriter) -> None:
        writer.register("checkpoint", self.record)
        writer.register("event", self.events)
        writer.register("resumed", self.resumed)
        writer.register("refused", self.refused)
        writer.register("moved", self.moved)
        writer.register("adopted", self.adopted)

    # -- handlers (writer thread) -----------------------------------------------------------

    def record(self, conn: Connection, results: list[SaveResult]) -> list[Callable[[], None]]:
        """Insert the checkpoints' rows and apply retention; returns the folder deletions, which
        the writer runs only after the transaction commits."""
        from sqlalchemy import insert, update  # noqa: PLC0415 - on the writer thread (see above)

        from db.models import Checkpoint  # noqa: PLC0415 - on the writer thread (see above)

        now = time.time()
        for result in results:
            # A checkpoint of an abandoned lineage at the same step was just replaced on disk.
            conn.execute(
                update(Checkpoint)
                .where(Checkpoint.run_id == self.run_id, Checkpoint.step == result.step,
                       Checkpoint.path == str(result.path), Checkpoint.deleted.is_(False))
                .values(deleted=True, deleted_at=now, deleted_reason=f"replaced by attempt {self.attempt}")
            )
            conn.execute(
                insert(Checkpoint).values(
                    run_id=self.run_id, attempt=self.attempt, step=result.step, path=str(result.path),
                    bytes=result.bytes, sha256=result.manifest_sha256, params_digest=result.params_digest,
                    metrics_json=json.dumps({k: _finite_or_none(v) for k, v in result.metrics.items()}),
                    blocked_s=result.blocked_s, total_s=result.total_s, created_at=now,
                    verified=True, pinned=False, deleted=False,
                )
            )
        return self._apply_retention(conn, now)

    def adopted(self, conn: Connection, files: list[AdoptedFile]) -> None:
        """Record files the script saved itself and adopted (``Run.adopt_checkpoint``) as
        ``source = "script"`` rows; an earlier version of the same file, rewritten in place, is
        marked deleted unless it was pinned (then its bytes were copied away)."""
        from sqlalchemy import insert, update  # noqa: PLC0415 - on the writer thread (see above)

        from db.models import Checkpoint  # noqa: PLC0415 - on the writer thread (see above)
        from db.requests import SCRIPT_SOURCE  # noqa: PLC0415 - on the writer thread (see above)

        for f in files:
            conn.execute(
                update(Checkpoint)
                .where(Checkpoint.run_id == self.run_id, Checkpoint.source == SCRIPT_SOURCE,
                       Checkpoint.origin == f.path, Checkpoint.path == f.path, Checkpoint.deleted.is_(False),
                       Checkpoint.pinned.is_(False))
                .values(deleted=True, deleted_at=f.at, deleted_reason=f"overwritten by the script at step {f.step}")
            )
            conn.execute(
                insert(Checkpoint).values(
                    run_id=self.run_id, attempt=self.attempt, step=f.step, path=f.path, origin=f.path, bytes=f.size,
                    sha256=f.sha256, params_digest="", metrics_json="{}", blocked_s=f.hash_s, total_s=f.hash_s,
                    created_at=f.at, verified=True, pinned=False, deleted=False, source=SCRIPT_SOURCE,
                    file_mtime=f.mtime,
                )
            )

    def events(self, conn: Connection, events: list[dict[str, Any]]) -> None:
        from sqlalchemy import insert  # noqa: PLC0415 - on the writer thread (see above)

        from db.models import Event  # noqa: PLC0415 - on the writer thread (see above)

        for e in events:
            conn.execute(insert(Event).values(run_id=self.run_id, attempt=self.attempt, at=e["at"],
                                                         level=e["level"], kind=e["kind"], message=e["message"]))

    def resumed(self, conn: Connection, steps: list[int]) -> None:
        from sqlalchemy import update  # noqa: PLC0415 - on the writer thread (see above)

        from db.models import Attempt  # noqa: PLC0415 - on the writer thread (see above)

        conn.execute(update(Attempt).where(Attempt.run_id == self.run_id, Attempt.number == self.attempt)
                     .values(resume_step=steps[-1]))

    def moved(self, conn: Connection, moves: list[tuple[str, str]]) -> None:
        from sqlalchemy import update  # noqa: PLC0415 - on the writer thread (see above)

        from db.models import Checkpoint  # noqa: PLC0415 - on the writer thread (see above)

        for source, target in moves:
            conn.execute(update(Checkpoint).where(Checkpoint.run_id == self.run_id, Checkpoint.path == source,
                                                  Checkpoint.deleted.is_(False)).values(path=target))

    def refused(self, conn: Connection, refusals: list[tuple[str, str]]) -> None:
        """Mark refused checkpoints (by path: a fork's may belong to its parent run)."""
        from sqlalchemy import update  # noqa: PLC0415 - on the writer thread (see above)

        from db.models import Checkpoint  # noqa: PLC0415 - on the writer thread (see above)

        for path, reason in refusals:
            conn.execute(update(Checkpoint).where(Checkpoint.path == path, Checkpoint.deleted.is_(False))
                         .values(verified=False, refused_reason=reason))

    def _apply_retention(self, conn: Connection, now: float) -> list[Callable[[], None]]:
        """Mark the checkpoints retention lets go as deleted; returns the deletions of their
        folders, to run after the commit (a rollback must not leave rows for folders that are gone)."""
        from sqlalchemy import select, update  # noqa: PLC0415 - on the writer thread (see above)

        from db.models import Checkpoint  # noqa: PLC0415 - on the writer thread (see above)

        rows = conn.execute(
            select(Checkpoint.id, Checkpoint.step, Checkpoint.verified, Checkpoint.pinned, Checkpoint.metrics_json,
                   Checkpoint.path)
            .where(Checkpoint.run_id == self.run_id, Checkpoint.deleted.is_(False))
        ).all()
        own_root = str(self.manager.root)
        # Superseded checkpoints (moved aside when the run resumed from an older one) are not
        # part of the current lineage: retention leaves them alone.
        rows = [r for r in rows if str(Path(r.path).parent) == own_root]
        infos = [
            CheckpointInfo(step=r.step, verified=bool(r.verified), pinned=bool(r.pinned),
                           metric=json.loads(r.metrics_json or "{}").get(self.config.best_metric))
            for r in rows
        ]
        self._say_unranked(conn, rows, infos, now)
        keep_last = self.config.keep_last
        if keep_last == 0:
            return []  # keep everything
        kept = select_kept(infos, keep_last, self.config.keep_best, self.config.best_mode)
        deletions: list[Callable[[], None]] = []
        for r in rows:
            if r.step in kept:
                continue
            deletions.append(functools.partial(self._delete_folder, r.step))
            conn.execute(update(Checkpoint).where(Checkpoint.id == r.id).values(
                deleted=True, deleted_at=now,
                deleted_reason=f"retention: not among the last {keep_last}, the best {self.config.keep_best} "
                               f"by {self.config.best_metric}, or pinned"))
        return deletions

    def _say_unranked(self, conn: Connection, rows: list[Any], infos: list[CheckpointInfo], now: float) -> None:
        """``keep_best`` ranks by a metric no checkpoint carries (``eval_loss`` where the script
        saves ``val_loss``): it keeps nothing by it. Say so once, with the names that were seen."""
        if self._unranked_said or not self.config.keep_best or not infos or any(i.metric is not None for i in infos):
            return
        seen = sorted({k for r in rows for k in json.loads(r.metrics_json or "{}")})
        if not seen and len(infos) < 2:
            return  # the first checkpoint may carry no metrics yet
        from sqlalchemy import insert  # noqa: PLC0415 - on the writer thread (see above)

        from db.models import Event  # noqa: PLC0415 - on the writer thread (see above)

        self._unranked_said = True
        names = ", ".join(repr(n) for n in seen) if seen else "none"
        conn.execute(insert(Event).values(
            run_id=self.run_id, attempt=self.attempt, at=now, level="warning", kind="checkpoint",
            message=f"checkpoint.keep_best = {self.config.keep_best} keeps nothing by checkpoint.best_metric = "
                    f"{self.config.best_metric!r}: no checkpoint carries it; the metrics the checkpoints carry: "
                    f"{names} (set checkpoint.best_metric to one of them)"))

    def _delete_folder(self, step: int) -> None:
        self.manager.delete(step)
        logger.info("checkpoint step %d deleted by retention", step)


def _finite_or_none(value: float) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def event(kind: str, message: str, level: str = "info") -> dict[str, Any]:
    """An event record for the database writer's ``event`` kind."""
    return {"at": time.time(), "kind": kind, "message": message, "level": level}
