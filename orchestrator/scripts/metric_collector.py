"""One attempt's metrics and activity, gathered from what an unchanged script leaves behind.

The scheduler makes an :class:`AttemptCollector` when it launches an attempt and calls
:meth:`AttemptCollector.collect` every tick or so. Each call reads what is new, a bounded amount:
the ranks' stdout and stderr (torchrun's ``ranks/<rdzv>/attempt_0/<local_rank>/std*.log``) for
``RUNYARD`` lines and the config's regexes, and the TensorBoard event files under the working
directory. It returns the new points (rows for ``db.metricstore.write_points``), the progress
total if the script reported one, and the facts a hang watchdog needs: the newest step per
source and when output last grew. :func:`write` stores the points and moves the attempt's
progress (``last_step``, ``progress_at``, ``first_step_at``) forward, as rank 0's reporter does
for the SDK.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, case, func, update
from sqlalchemy.orm import Session

from db.metricstore import write_points
from db.models import Attempt
from orchestrator.executors.logs import rank_log_files
from orchestrator.scripts import Sample, to_rows
from orchestrator.scripts.log_lines import LineTailer, compile_patterns, parse_lines

if TYPE_CHECKING:  # tensorboard is an optional extra: imported when event files are watched
    from orchestrator.scripts.tensorboard_events import EventFiles

logger = logging.getLogger(__name__)

MAX_PROBLEMS_KEPT = 100  # distinct problems remembered (each is reported once)


@dataclass(frozen=True)
class Activity:
    """What a hang watchdog can watch for a script that reports nothing itself.

    Attributes:
        newest_step: The largest step seen so far per source: ``"protocol"`` (RUNYARD lines,
            the wandb shim), ``"stdout_metrics"`` (the config's regexes), ``"tensorboard"``.
        output_at: When a rank's stdout or stderr last grew (the file's modification time).
        events_at: When a TensorBoard event file last grew.
    """

    newest_step: dict[str, int]
    output_at: float | None
    events_at: float | None

    @property
    def last_at(self) -> float | None:
        """The newest of ``output_at`` and ``events_at``."""
        times = [t for t in (self.output_at, self.events_at) if t is not None]
        return max(times) if times else None


@dataclass(frozen=True)
class Collected:
    """What one :meth:`AttemptCollector.collect` found.

    Attributes:
        points: New rows for ``db.metricstore.write_points``.
        activity: The attempt's activity so far.
        total: The step the script said it ends at (protocol ``total``), the newest one; None if
            it never said.
        problems: Problems not reported before (a malformed RUNYARD line, a regex whose value is
            not a number, TensorBoard not installed), each naming what and where.
        behind: The bounded read left data unread: call again soon.
        saved: The newest printed line that says a checkpoint was saved
            (``log_lines.SAVED_LINE``), with its rank; None when this read found none.
    """

    points: list[dict[str, Any]]
    activity: Activity
    total: int | None
    problems: list[str]
    behind: bool
    saved: tuple[int, str] | None = None


@dataclass
class _Stream:
    tailer: LineTailer
    rank: int


@dataclass
class _Problems:
    seen: set[str] = field(default_factory=set)

    def new(self, problems: Sequence[str]) -> list[str]:
        fresh = [p for p in dict.fromkeys(problems) if p not in self.seen]
        if len(self.seen) < MAX_PROBLEMS_KEPT:
            self.seen.update(fresh)
        return fresh


class AttemptCollector:
    """Reads one attempt's output and event files incrementally.

    Args:
        run_id: The run.
        attempt: The attempt's number.
        attempt_dir: The attempt's folder (torchrun's per-rank logs under ``ranks/``).
        workdir: The script's working directory (default TensorBoard folders are searched there).
        stdout_metrics: ``[workload.stdout_metrics]``: metric name -> regex with ``step`` and
            ``value`` groups (checked at submit; a bad one raises ``PatternError`` here).
        tensorboard_dirs: Folders to watch for event files, relative to ``workdir`` or absolute;
            None for the defaults (``runs/``, ``lightning_logs/``, ``tb/`` under ``workdir``);
            empty to watch none.
        pid_ranks: ``{pid: rank}`` of the ranks' processes, for the rank of an event file.
        since: The attempt's start: event files last modified before it belong to earlier
            attempts and are not read.
        max_bytes: The most bytes of logs one call reads (512 KiB at most per file).
        max_events: The most TensorBoard events one call reads.
        rescan_s: How often folders are searched for new log and event files, once every rank's
            log files were found.
        ranks: The attempt's world size: until that many ranks' log files are found, the folders
            are searched on every call, so that a rank's first lines (its first step, its first
            loss) are read as soon as they are written instead of up to ``rescan_s`` later.
        clock: Monotonic time (tests pass their own).
    """

    def __init__(self, run_id: int, attempt: int, attempt_dir: Path, workdir: Path, *,
                 stdout_metrics: Mapping[str, str] | None = None, tensorboard_dirs: Sequence[str] | None = None,
                 pid_ranks: Mapping[int, int] | None = None, since: float | None = None,
                 max_bytes: int = 2 << 20, max_events: int = 5_000, rescan_s: float = 5.0, ranks: int = 1,
                 clock: Callable[[], float] = time.monotonic):
        self.run_id = run_id
        self.attempt = attempt
        self.attempt_dir = attempt_dir
        self.workdir = workdir
        self.patterns = compile_patterns(stdout_metrics)
        self.max_bytes = max_bytes
        self.rescan_s = rescan_s
        self.ranks = ranks
        self._clock = clock
        self._streams: dict[Path, _Stream] = {}
        self._scanned_at: float | None = None
        self._problems = _Problems()
        self._newest: dict[str, int] = {}
        self._total: int | None = None
        self._tensorboard_missing: str | None = None
        self._events = self._event_files(tensorboard_dirs, pid_ranks, since, max_events)

    def _event_files(self, dirs: Sequence[str] | None, pid_ranks: Mapping[int, int] | None, since: float | None,
                     max_events: int) -> EventFiles | None:
        if dirs is not None and not dirs:
            return None
        try:
            from orchestrator.scripts.tensorboard_events import EventFiles, default_dirs  # noqa: PLC0415 - optional: tensorboard, the [scripts] extra
        except ImportError as exc:
            self._tensorboard_missing = (f"TensorBoard event files are not read: the tensorboard package is not "
                                         f"installed ({exc}); pip install 'runyard[scripts]'")
            return None
        folders: Sequence[Path] | Callable[[], Sequence[Path]]
        if dirs is None:
            workdir = self.workdir
            folders = lambda: default_dirs(workdir)  # noqa: E731 - searched again as folders appear
        else:
            folders = [Path(d) if Path(d).is_absolute() else self.workdir / d for d in dirs]
        return EventFiles(folders, since=since, pid_ranks=pid_ranks, max_events=max_events, rescan_s=self.rescan_s,
                          clock=self._clock)

    def set_pid_ranks(self, pid_ranks: Mapping[int, int]) -> None:
        """The ranks' pids, once the scheduler knows them."""
        if self._events is not None:
            self._events.set_pid_ranks(pid_ranks)

    def _scan_logs(self) -> None:
        now = self._clock()
        every_rank = len({stream.rank for stream in self._streams.values()}) >= self.ranks
        if every_rank and self._scanned_at is not None and now - self._scanned_at < self.rescan_s:
            return
        self._scanned_at = now
        per_file = min(512 << 10, self.max_bytes)
        for rank, paths in rank_log_files(self.attempt_dir).items():  # global ranks, on every node
            for path in paths:
                if path not in self._streams:
                    self._streams[path] = _Stream(LineTailer(path, max_bytes=per_file), rank)

    def collect(self, final: bool = False) -> Collected:
        """What is new since the last call.

        Args:
            final: The attempt has ended: search for log and event files again (a file created in
                the ranks' last second, after the previous search, counts too) and read every one
                to its end, unfinished last lines too (still at most ``max_bytes`` per call and
                ``max_events`` events; ``behind`` says when to call again).
        """
        if final:
            self._scanned_at = None
        self._scan_logs()
        samples: list[Sample] = []
        problems: list[str] = []
        budget, behind = self.max_bytes, False
        saved: tuple[int, str] | None = None
        for stream in sorted(self._streams.values(), key=lambda s: s.tailer.offset - s.tailer.size):
            if budget <= 0:
                behind = True
                break
            before = stream.tailer.offset
            lines = stream.tailer.read(final=final)
            budget -= stream.tailer.offset - before
            behind |= stream.tailer.behind
            if not lines:
                continue
            parsed = parse_lines(lines, stream.rank, stream.tailer.grew_at or time.time(), self.patterns)
            samples.extend(parsed.samples)
            problems.extend(f"{stream.tailer.path.name} of rank {stream.rank}: {p}" for p in parsed.problems)
            for source, step in parsed.newest_step.items():
                self._newest[source] = max(step, self._newest.get(source, step))
            if parsed.total is not None:
                self._total = parsed.total
            if parsed.saved is not None:
                saved = (stream.rank, parsed.saved)
        if self._tensorboard_missing:
            problems.append(self._tensorboard_missing)
        if self._events is not None:
            events = self._events.poll(final=final)
            samples.extend(events)
            behind |= self._events.behind
            if self._events.newest_step is not None:
                self._newest["tensorboard"] = self._events.newest_step
        return Collected(points=to_rows(samples, self.run_id, self.attempt), activity=self.activity(),
                         total=self._total, problems=self._problems.new(problems), behind=behind, saved=saved)

    def activity(self) -> Activity:
        """The activity so far, without reading anything."""
        output = [s.tailer.grew_at for s in self._streams.values() if s.tailer.grew_at is not None]
        return Activity(newest_step=dict(self._newest), output_at=max(output) if output else None,
                        events_at=self._events.grew_at if self._events is not None else None)


def write(target: Session | Connection, run_id: int, attempt: int, points: list[dict[str, Any]], *,
          step: int | None = None, at: float | None = None) -> None:
    """Store ``points`` and move the attempt's progress forward, in the caller's transaction.

    The attempt's ``last_step`` becomes ``step`` (default: the largest step of ``points``) when
    that is larger, ``progress_at`` becomes ``at`` (default: the newest ``wall_time`` of
    ``points``) when that is later, and ``first_step_at`` is set once: what the scheduler's hang
    watchdog and the STARTING -> RUNNING move read (trainer/reporting/reporter.py writes the same for the
    SDK). Neither ever moves back, so points read again after a restart change nothing.

    Args:
        target: A Session or a Connection; the caller commits.
        run_id: The run.
        attempt: The attempt's number.
        points: Rows as :meth:`AttemptCollector.collect` returns them.
        step: The progress step, when the caller chooses it (e.g. from one source only).
        at: The progress time, when the caller chooses it (e.g. ``Activity.last_at``).
    """
    conn = target.connection() if isinstance(target, Session) else target
    write_points(conn, points)
    if step is None and points:
        step = max(int(p["step"]) for p in points)
    if at is None and points:
        at = max(float(p["wall_time"]) for p in points)
    if at is None and step is None:
        return
    A = Attempt
    values: dict[str, Any] = {}
    if at is not None:
        values["progress_at"] = case((A.progress_at.is_(None), at), (A.progress_at < at, at), else_=A.progress_at)
    if step is not None:
        values["last_step"] = case((A.last_step.is_(None), step), (A.last_step < step, step), else_=A.last_step)
        values["first_step_at"] = func.coalesce(A.first_step_at, at if at is not None else time.time())
    conn.execute(update(A).where(A.run_id == run_id, A.number == attempt).values(**values))
