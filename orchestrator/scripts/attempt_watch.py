"""What the scheduler watches of a script run (kind = "script") while it runs and when it ends.

One :class:`ScriptWatch` lives in the scheduler. For every live attempt of a script run it keeps
an :class:`~orchestrator.scripts.metric_collector.AttemptCollector`: on each tick the new metric
points (``RUNYARD`` lines, ``[workload.stdout_metrics]``, TensorBoard scalars, the wandb
stand-in) go into the metric store and move the attempt's progress, and the script's output
activity becomes what the hang watchdog watches for a script that reports no step. With
``[workload] checkpoint_glob``, the script's own checkpoint files are listed too and recorded as
checkpoint rows (orchestrator/scripts/checkpoint_custody.py). When the attempt ends, its logs are read to
the end and its files looked at until they are hashed (to completion, whatever their size) before
the outcome is settled, so an attempt's last steps and last checkpoint count.

The files are read and hashed before anything is written in the transaction: SQLite's write lock
is not held while a checkpoint is hashed. A collector's read offsets move on as it reads; when
the transaction that stored what it read is rolled back, the scheduler forgets the attempt
(:meth:`ScriptWatch.forget`) and the next tick reads again from the start.

It keeps everything in memory: a scheduler restarted mid-run reads the logs again from the
start, and the metric store keeps a point's first value, so nothing is counted twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from db.models import Attempt, Event, Run
from db.requests import SCRIPT_SOURCE, workdir_of
from db.vocabulary.config import RunConfig, ScriptWorkload, workload_as
from orchestrator.executors.processes import rank_processes
from orchestrator.scripts.checkpoint_custody import record_versions
from orchestrator.scripts.checkpoint_finder import CheckpointFile, CheckpointFiles
from orchestrator.scripts.metric_collector import AttemptCollector, Collected, write

logger = logging.getLogger(__name__)

# The event that says the checkpoint glob matched nothing.
UNMATCHED_EVENT = "checkpoint-glob"
# What the hang watchdog watches (attempts.watching).
WATCH_STEPS = "steps"
WATCH_OUTPUT = "output"
# Steps, and while they pause, the script's output (set by the hang watchdog the first time output
# kept an attempt that reports steps from being judged hung: orchestrator/scheduler/watchdog.py).
WATCH_STEPS_OR_OUTPUT = "steps-or-output"
# The ranks' pids are looked up this often until all are known (an event file's rank).
PIDS_EVERY_S = 5.0
# The final read of an ended attempt's logs: at most this many bounded reads.
FINAL_READS = 64
# The final looks at an ended attempt's checkpoint files: a file is hashed once it is unchanged at
# two looks, to completion (nothing writes it any more, so no settle time is waited for).
FINAL_LOOKS = 16
FINAL_HASH_BUDGET = 1 << 62
# A checkpoint_glob that has matched nothing is said (once an attempt) this long after the script
# printed that it saved one (the file may follow its message), or after this long of training.
SAVED_GRACE_S = 30.0
NOTHING_MATCHED_AFTER_S = 600.0


@dataclass
class _Watched:
    collector: AttemptCollector
    checkpoints: CheckpointFiles | None = None
    pids_at: float = 0.0
    pids_known: bool = False
    output_at: float | None = None  # the output time last written as the attempt's progress
    saved: tuple[int, str] | None = None  # (rank, line): the last printed line that says it saved
    saved_at: float | None = None  # when that line was read (monotonic)
    matched: bool = False  # the checkpoint glob has matched something in this attempt
    unmatched_said: bool = False


def watching_words(watching: str | None, script: bool) -> str:
    """What the hang watchdog watches, in words, for the Run page and ``runyard show``."""
    if watching == WATCH_STEPS:
        return "completed steps (a hang is no new step for supervision.hang_timeout_s)"
    if watching == WATCH_STEPS_OR_OUTPUT:
        return ("completed steps, and while they pause the script's output (its ranks' stdout and stderr and "
                "TensorBoard event files): a hang is neither for supervision.hang_timeout_s")
    if watching == WATCH_OUTPUT:
        return ("the script's output: its ranks' stdout and stderr and TensorBoard event files (a hang is no new "
                "output for supervision.hang_timeout_s)")
    if script:
        return "nothing yet: the script has reported no step and printed nothing; it is not judged hung until it does"
    return "the first step (start-up: supervision.startup_timeout_s)"


def script_facts(config: dict[str, Any], attempts: list[dict[str, Any]],
                 checkpoints: list[dict[str, Any]] | None = None) -> list[tuple[str, str]]:
    """How a script run runs, as (label, text) pairs for the Run page and ``runyard show``: its
    working directory, its interpreter when it is not runyard's, what the hang watchdog of its
    newest attempt watches, and what its ``checkpoint_glob`` has found. Empty for the built-in
    workloads.

    Args:
        config: The run's config as stored (``run_detail``'s ``config``).
        attempts: The run's attempts, oldest first (``run_detail``'s ``attempts``).
        checkpoints: The run's checkpoints (``run_detail``'s ``checkpoints``); None: not said.
    """
    workload = config.get("workload", {})
    if workload.get("kind") != "script":
        return []
    facts = [("working directory", str(workload.get("workdir") or "the run's folder"))]
    if workload.get("python"):
        facts.append(("python", str(workload["python"])))
    if attempts:
        facts.append(("hang watchdog watches", watching_words(attempts[-1].get("watching"), True)))
    glob = workload.get("checkpoint_glob")
    if glob and attempts and checkpoints is not None:
        found = [c for c in checkpoints if c.get("source") == SCRIPT_SOURCE]
        if not found:
            facts.append(("checkpoint files", f"{glob!r} has matched nothing yet: no checkpoint of the script's own "
                                              "to resume from (the events say more)"))
        else:
            own = [c for c in found if not c.get("refused_reason")]
            refused = len(found) - len(own)
            but = f" ({refused} refused: see the list)" if refused else ""
            if own:
                newest = max(own, key=lambda c: (c["file_mtime"] or 0, c["id"]))
                facts.append(("checkpoint files", f"{glob!r}: {len(found)} version(s) recorded, the newest of the "
                                                  f"run's own at step {newest['step']}{but}"))
            else:
                facts.append(("checkpoint files", f"{glob!r}: {len(found)} version(s) recorded, none of them the "
                                                  f"run's own to resume from{but}"))
    return facts


class ScriptWatch:
    """The scheduler's collectors, one per live attempt of a script run.

    Args:
        saved_grace_s: How long after a printed "saved" line a glob that matched nothing is said.
        nothing_matched_after_s: How long of training (since the first step) before a glob that
            matched nothing is said.
    """

    def __init__(self, saved_grace_s: float = SAVED_GRACE_S,
                 nothing_matched_after_s: float = NOTHING_MATCHED_AFTER_S) -> None:
        self._attempts: dict[tuple[int, int], _Watched] = {}
        self.saved_grace_s = saved_grace_s
        self.nothing_matched_after_s = nothing_matched_after_s

    def _watched(self, run: Run, attempt: Attempt, config: RunConfig) -> _Watched:
        key = (run.id, attempt.number)
        watched = self._attempts.get(key)
        if watched is None:
            workload = workload_as(config.workload, ScriptWorkload)
            workdir = workdir_of(run, config)
            collector = AttemptCollector(
                run.id, attempt.number, Path(attempt.dir), workdir,
                stdout_metrics=workload.stdout_metrics,
                tensorboard_dirs=[workload.tensorboard_dir] if workload.tensorboard_dir else None,
                since=attempt.started_at, ranks=config.launch.world_size,
            )
            files = (CheckpointFiles(workdir, [workload.checkpoint_glob],
                                     step_keys=[workload.checkpoint_step_key] if workload.checkpoint_step_key else ())
                     if workload.checkpoint_glob else None)
            watched = self._attempts[key] = _Watched(collector, files)
        return watched

    def tick(self, session: Session, run: Run, attempt: Attempt, config: RunConfig) -> None:
        """Read what is new of a live attempt and store it (the caller commits)."""
        watched = self._watched(run, attempt, config)
        now = time.monotonic()
        if not watched.pids_known and now - watched.pids_at >= PIDS_EVERY_S:
            watched.pids_at = now
            pid_ranks = _pid_ranks(run, attempt)
            if len(pid_ranks) >= config.launch.world_size:
                watched.pids_known = True
            if pid_ranks:
                watched.collector.set_pid_ranks(pid_ranks)
        collected = watched.collector.collect()
        files = watched.checkpoints.scan() if watched.checkpoints is not None else None  # hashing: before any write
        self._store(session, run, attempt, config, collected, watched)
        if files is not None:
            record_versions(session, run, attempt, files)
            self._unmatched(session, run, attempt, config, watched, files, final=False)

    def finish(self, session: Session, run: Run, attempt: Attempt, config: RunConfig) -> None:
        """The attempt ended: read its logs to the end, store the rest, and forget it."""
        watched = self._watched(run, attempt, config)
        reads: list[Collected] = []
        for _ in range(FINAL_READS):
            reads.append(watched.collector.collect(final=True))
            if not reads[-1].behind:
                break
        files = None
        if watched.checkpoints is not None:
            # Nothing writes them any more: hash to completion, before anything is written here;
            # no settle time, and a folder without its framework's last file is recorded refused.
            watched.checkpoints.hash_budget = FINAL_HASH_BUDGET
            watched.checkpoints.writer_gone()
            for _ in range(FINAL_LOOKS):
                files = watched.checkpoints.scan()
                if all(f.stable and f.sha256 is not None for f in files):
                    break
        for collected in reads:
            self._store(session, run, attempt, config, collected, watched)
        if files is not None:
            record_versions(session, run, attempt, files)
            self._unmatched(session, run, attempt, config, watched, files, final=True)
        self.forget(run.id, attempt.number)

    def _unmatched(self, session: Session, run: Run, attempt: Attempt, config: RunConfig, watched: _Watched,
                   files: list[CheckpointFile], final: bool) -> None:
        """Say, once an attempt, that ``checkpoint_glob`` matched nothing although the script
        printed that it saved (after :attr:`saved_grace_s`, or at its end), or after
        :attr:`nothing_matched_after_s` of training."""
        watched.matched |= bool(files)
        if watched.matched or watched.unmatched_said:
            return
        why = None
        if watched.saved is not None and watched.saved_at is not None and (
                final or time.monotonic() - watched.saved_at >= self.saved_grace_s):
            why = f"although rank {watched.saved[0]} printed {watched.saved[1]!r}"
        elif attempt.first_step_at is not None and (
                time.time() - attempt.first_step_at >= self.nothing_matched_after_s):
            why = f"after {(time.time() - attempt.first_step_at) / 60:.0f} min of training"
        if why is None:
            return
        watched.unmatched_said = True
        glob = workload_as(config.workload, ScriptWorkload).checkpoint_glob
        message = (f"workload.checkpoint_glob = {glob!r} has matched nothing under "
                   f"{workdir_of(run, config)} {why}: runyard records none of the script's checkpoints, so a retry "
                   "or a resume cannot start from one. Check the pattern against where the script saves (a folder "
                   "is matched too: 'hf_out/checkpoint-*' for Hugging Face's checkpoint-350/)")
        logger.warning("run %d attempt %d: %s", run.id, attempt.number, message)
        session.add(Event(run_id=run.id, attempt=attempt.number, at=time.time(), level="warning",
                          kind=UNMATCHED_EVENT, message=message))

    def output_at(self, run_id: int, attempt: int) -> float | None:
        """When the attempt's ranks last wrote output (stdout, stderr, event files), as far as
        the reads so far saw; None when it is not watched or wrote none."""
        watched = self._attempts.get((run_id, attempt))
        return watched.collector.activity().last_at if watched is not None else None

    def forget(self, run_id: int, attempt: int) -> None:
        """Drop an attempt's collector: the next tick reads its logs from the start (the metric
        store keeps a point's first value) and looks at its files afresh."""
        self._attempts.pop((run_id, attempt), None)

    def forget_run(self, run_id: int) -> None:
        for key in [k for k in self._attempts if k[0] == run_id]:
            del self._attempts[key]

    def prune(self, live: set[tuple[int, int]]) -> list[tuple[int, int]]:
        """Forget the attempts that are not in ``live`` (ended, or their run left the active
        states without :meth:`finish`); returns them."""
        gone = sorted(self.live() - live)
        for run_id, number in gone:
            self.forget(run_id, number)
        return gone

    def live(self) -> set[tuple[int, int]]:
        """The (run, attempt) pairs watched now."""
        return set(self._attempts)

    @staticmethod
    def _store(session: Session, run: Run, attempt: Attempt, config: RunConfig, collected: Collected,
               watched: _Watched) -> None:
        """Store what one read found. A quiet tick (no point, no new output) writes nothing: the
        attempt row was loaded this tick, and it is read back only after this writes to it."""
        activity = collected.activity
        if collected.saved is not None:
            watched.saved, watched.saved_at = collected.saved, time.monotonic()
        if collected.points:
            write(session, run.id, attempt.number, collected.points)
            session.flush()
            session.refresh(attempt, ["last_step", "progress_at", "first_step_at"])
        if attempt.first_step_at is None and activity.last_at is not None and activity.last_at != watched.output_at:
            # No step reported: the script's output is what shows it is alive.
            write(session, run.id, attempt.number, [], at=activity.last_at)
            session.flush()
            session.refresh(attempt, ["progress_at"])
            watched.output_at = activity.last_at
        watching = (WATCH_STEPS if attempt.first_step_at is not None
                    else WATCH_OUTPUT if attempt.progress_at is not None else None)
        if watching == WATCH_STEPS and attempt.watching == WATCH_STEPS_OR_OUTPUT:
            watching = WATCH_STEPS_OR_OUTPUT  # the watchdog's choice stays
        if watching != attempt.watching:
            attempt.watching = watching
            if watching is not None:
                session.add(Event(run_id=run.id, attempt=attempt.number, at=time.time(), kind="watch",
                                  message=f"the hang watchdog now watches {watching_words(watching, True)}"))
        if (collected.total is not None and workload_as(config.workload, ScriptWorkload).max_steps == 0
                and run.max_steps != collected.total):
            run.max_steps = collected.total
        for problem in collected.problems:
            logger.warning("run %d attempt %d: %s", run.id, attempt.number, problem)
            session.add(Event(run_id=run.id, attempt=attempt.number, at=time.time(), level="warning",
                              kind="metrics", message=problem))


def _pid_ranks(run: Run, attempt: Attempt) -> dict[int, int]:
    """``{pid: global rank}`` of the attempt's ranks, from the ``RANK`` torchrun gave each."""
    out: dict[int, int] = {}
    for proc in rank_processes(run.run_dir, attempt.number, attempt.pid, attempt.pid_create_time, orphans=False):
        try:
            rank = proc.environ().get("RANK")
        except Exception:  # noqa: BLE001, S112 - psutil.Error, OSError: the process is gone
            continue
        if rank is not None and rank.isdigit():
            out[proc.pid] = int(rank)
    return out
