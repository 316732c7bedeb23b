"""The hang watchdog: an attempt with no completed step for too long is hung. Evidence first
(every rank's stacks, taken off the tick by orchestrator/executors/stacks.py), then the kill, then the
retry policy. When one rank alone stopped, the stacks name it and the attempt records it as the
failing rank. When that rank waits inside an exception handler (it raised, and its handler waits
for the other ranks: Lightning's ``OnExceptionCheckpoint``, Lightning #20187), the attempt is booked
as that rank's exception (``USER_ERROR``), not as a hang, and the retry policy treats it as one."""

from __future__ import annotations

import logging
import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from db import metricstore
from db.models import Attempt, Event, Run
from db.states import AttemptPhase, SignalSent, StopReason
from db.vocabulary.causes import Cause
from db.vocabulary.config import SupervisionConfig
from orchestrator.executors.logs import rank_log_files
from orchestrator.executors.stack_reading import RankStack, in_handler, stack_frames
from orchestrator.executors.stacks import StackDump, StackDumps
from orchestrator.scheduler.failures import stderr_exception, with_location
from orchestrator.scheduler.storage import StorageFaults
from orchestrator.scripts.attempt_watch import WATCH_STEPS_OR_OUTPUT, watching_words

if TYPE_CHECKING:
    from orchestrator.executors.base import Executor

logger = logging.getLogger(__name__)

# Time the ranks get to write their stacks between SIGUSR1 and SIGKILL when no dump result is
# known (a scheduler restarted after it detected the hang).
STACKS_WAIT_S = 2.0
# The kill waits for the dump at most this long (a dump bounds itself to about 12 s).
DUMP_MAX_WAIT_S = 30.0
# Said after the exception of a rank found waiting inside its exception handler.
HANDLER_DEADLOCK = ("it waited inside its exception handler for the other ranks, which waited elsewhere: a "
                    "deadlock, not a hang (Lightning's OnExceptionCheckpoint with more than one rank does this: "
                    "docs/frameworks.md)")


def hang_key(run_id: int, attempt: int) -> tuple[str, int, int]:
    """The key of an attempt's hang dump in :class:`~orchestrator.executors.stacks.StackDumps`."""
    return ("hang", run_id, attempt)


def request_key(run_id: int, attempt: int) -> tuple[str, int, int]:
    """The key of a dump the user asked for (the UI's *Dump stacks*, ``runyard stacks``)."""
    return ("request", run_id, attempt)


def p95_step_time(session: Session, run_id: int, attempt: int) -> float | None:
    newest = metricstore.recent(session, run_id, "step_time", attempt=attempt, rank=0, limit=400)
    values = [v for _, v, _ in newest if not math.isnan(v)]
    if len(values) < 5:
        return None
    return statistics.quantiles(values, n=20)[-1]


def hang_threshold_s(session: Session, run_id: int, attempt: int, config: SupervisionConfig) -> float:
    """max(hang_timeout_s, hang_step_factor x p95 step time)."""
    p95 = p95_step_time(session, run_id, attempt)
    return max(config.hang_timeout_s, config.hang_step_factor * p95) if p95 else config.hang_timeout_s


def check(session: Session, run: Run, attempt: Attempt, config: SupervisionConfig, script: bool,
          dumps: StackDumps, executor: Executor, now: float | None = None, output_at: float | None = None,
          storage: StorageFaults | None = None) -> None:
    """Call for a live attempt on every tick: detects a hang, starts the stack dump, and kills
    once the dump is done (or has run out of time).

    ``script``: the run is the user's own script, which may never report a step. ``executor``:
    the one that runs the attempt (it takes the stacks and kills). ``output_at``: when a script's
    ranks last wrote output; a script that reports a step once an epoch but prints meanwhile is
    alive while its output keeps coming (said once, in a ``watch`` event). ``storage``: the
    scheduler's storage faults; while the attempt's folder or the database cannot be written, its
    progress cannot be recorded, and no hang is called (said once, in a ``disk`` event); after
    one, the ranks get the whole threshold again to report.
    """
    now = time.time() if now is None else now
    if attempt.hang_detected_at is None:
        watched = _watch_window(session, run, attempt, config, script, now)
        if watched is None:
            return
        since, threshold = watched
        if storage is not None and storage.cleared_at is not None:
            since = max(since, storage.cleared_at)  # nothing the ranks reported could be stored until then
        if now - since <= threshold:
            return
        if script and attempt.first_step_at is not None and output_at is not None and now - output_at <= threshold:
            _output_is_life(session, run, attempt, now - since, now - output_at, threshold, now)
            return
        problem = storage.problem(Path(attempt.dir), f"run {run.id} attempt {attempt.number}'s hang check", now) \
            if storage is not None else None
        if problem is not None:
            if storage is not None and storage.hold(run.id, attempt.number):
                session.add(Event(run_id=run.id, attempt=attempt.number, at=now, level="warning", kind="disk",
                                  message=f"no progress recorded for {now - since:.0f} s (threshold {threshold:.0f} s) "
                                          f"while the storage cannot be written ({problem}): not called a hang, "
                                          "since no progress can be recorded; watched again once it can"))
            return
        dumps.start(hang_key(run.id, attempt.number), executor.stack_dump(run, attempt))
        attempt.hang_detected_at = now
        attempt.stop_reason = StopReason.HANG.value
        what = ("no step completed and no output" if attempt.first_step_at and script else
                "no step completed" if attempt.first_step_at else
                "no output from the script (stdout, stderr, event files)" if script else "no first step")
        session.add(Event(run_id=run.id, attempt=attempt.number, at=now, level="error", kind="hang",
                          message=f"hang: {what} for {now - since:.0f} s (threshold {threshold:.0f} s) after step "
                                  f"{attempt.last_step or 0}; saving every rank's stacks in "
                                  f"{Path(attempt.dir) / 'stacks'}, then killing the attempt"))
        logger.warning("run %d attempt %d: hang detected; saving stacks", run.id, attempt.number)
    elif attempt.signal_sent != SignalSent.SIGKILL:
        _kill_after_dump(session, run, attempt, dumps, executor, now)


def _watch_window(session: Session, run: Run, attempt: Attempt, config: SupervisionConfig, script: bool,
                  now: float) -> tuple[float, float] | None:
    """Since when the attempt has shown no progress, and the threshold that makes it a hang; None
    when nothing is judged yet (a script without output) or it is well within the threshold."""
    if attempt.first_step_at is None and script:
        # A script that reports no step is watched by its output (orchestrator/scripts/attempt_watch.py
        # moves progress_at as its logs and event files grow); before any output, nothing is judged.
        if attempt.progress_at is None:
            return None
        return attempt.progress_at, config.hang_timeout_s
    if attempt.first_step_at is None:
        return attempt.started_at, config.startup_timeout_s
    if attempt.phase == AttemptPhase.FINISHING:
        return attempt.progress_at or attempt.started_at, config.startup_timeout_s
    since = attempt.progress_at or attempt.first_step_at
    if now - since <= config.hang_timeout_s:
        return None  # the threshold is never below hang_timeout_s: no need to read step times
    return since, hang_threshold_s(session, run.id, attempt.number, config)


def _kill_after_dump(session: Session, run: Run, attempt: Attempt, dumps: StackDumps, executor: Executor,
                     now: float) -> None:
    """A hang was called: kill the attempt once its stack dump is done (or has run out of time),
    its evidence recorded first."""
    assert attempt.hang_detected_at is not None
    key = hang_key(run.id, attempt.number)
    waited = now - attempt.hang_detected_at
    result = dumps.take(key)
    if result is None:
        if dumps.running(key) and waited < DUMP_MAX_WAIT_S:
            return  # evidence before the kill
        if not dumps.running(key) and waited < STACKS_WAIT_S:
            return  # no dump of ours (restarted): give faulthandler its time
        dumps.discard(key)
    _record_dump(session, run, attempt, result, now)
    executor.kill(run, attempt)
    attempt.signal_sent, attempt.signal_sent_at = SignalSent.SIGKILL.value, now


def _output_is_life(session: Session, run: Run, attempt: Attempt, no_step_s: float, output_s: float,
                    threshold: float, now: float) -> None:
    """The first time a script's output keeps an attempt that reports steps from being judged
    hung: say so, and watch steps-or-output from now on (orchestrator/scripts/attempt_watch.py)."""
    if attempt.watching == WATCH_STEPS_OR_OUTPUT:
        return
    attempt.watching = WATCH_STEPS_OR_OUTPUT
    watches = watching_words(WATCH_STEPS_OR_OUTPUT, True)
    session.add(Event(run_id=run.id, attempt=attempt.number, at=now, kind="watch",
                      message=f"no step completed for {no_step_s:.0f} s (threshold {threshold:.0f} s) after step "
                              f"{attempt.last_step or 0}, but the script wrote output {output_s:.0f} s ago: counted as "
                              f"life, not a hang; the hang watchdog now watches {watches}"))


def hang_evidence_kept(session: Session, run: Run, attempt: Attempt, dumps: StackDumps,
                       now: float | None = None) -> bool:
    """For an attempt that ended on its own while its hang's stack dump ran (a rank crashed
    meanwhile, seen once as a SIGSEGV in a rank stopped and woken for its stacks): record what
    the dump found, as the kill would have, before the attempt is settled. False while the dump
    still runs (at most DUMP_MAX_WAIT_S after the hang was detected): the caller settles later."""
    key = hang_key(run.id, attempt.number)
    if attempt.hang_detected_at is None or attempt.signal_sent == SignalSent.SIGKILL or not dumps.running(key):
        return True
    now = time.time() if now is None else now
    result = dumps.take(key)
    if result is None and now - attempt.hang_detected_at < DUMP_MAX_WAIT_S:
        return False
    dumps.discard(key)
    _record_dump(session, run, attempt, result, now, ended=True)
    return True


def _record_dump(session: Session, run: Run, attempt: Attempt, result: StackDump | BaseException | None,
                 now: float, ended: bool = False) -> None:
    """The hang's evidence as an event; the rank that alone stopped becomes the failing rank."""
    then = "the attempt had ended meanwhile" if ended else "killing the attempt"
    if isinstance(result, StackDump):
        rank, why = result.culprit()
        attempt.failed_rank = rank
        found = f"; {why}" if rank is not None else "; the stacks do not single out one rank"
        found += top_frames_of(result, rank)  # alerts: the hang alert carries these (orchestrator/alerts)
        handling = in_handler(result.ranks)
        if handling is not None and handling.rank == rank:
            # Settled as this exception (orchestrator/scheduler/outcomes.py), not as a hang.
            attempt.cause, attempt.exception = Cause.USER_ERROR.value, handled_exception(Path(attempt.dir), handling)
            found += f"; booked as rank {rank}'s exception, not a hang: {attempt.exception}"
        message = f"{result.summary()}{found}; {then}"
    elif isinstance(result, BaseException):
        message = f"the stack dump failed ({result}); {then}"
    else:
        waited = now - (attempt.hang_detected_at or now)
        message = f"the stack dump did not finish in {waited:.0f} s; {then}"
    session.add(Event(run_id=run.id, attempt=attempt.number, at=now, level="error", kind="stacks", message=message))


def handled_exception(attempt_dir: Path, rank: RankStack) -> str:
    """The exception a rank waits inside the handler of: the first traceback in its stderr, with
    its place, when the script printed one; else its type as py-spy saw it among the handler's
    variables, with the handler's place; else "an exception", with the handler's place."""
    stderr = next((p for p in rank_log_files(attempt_dir).get(rank.rank, []) if p.name == "stderr.log"), None)
    raised = stderr_exception(stderr) if stderr is not None else None
    if raised is not None:
        return with_location(raised.exception, raised.location)
    return f"{rank.exception or 'an exception'} (handled at {rank.handler.place if rank.handler else '?'})"


def top_frames_of(result: StackDump, rank: int | None, count: int = 3) -> str:
    """``"; top of rank R's stack: f at a.py:1 < g at b.py:2"`` for the named rank (its innermost
    frames first), or empty when no rank is named or its stack has no frame."""
    text = next((r.text for r in result.ranks if r.rank == rank), "") if rank is not None else ""
    frames = stack_frames(text)[:count]
    return f"; top of rank {rank}'s stack: {' < '.join(frames)}" if frames else ""


def serve_dump_request(session: Session, run: Run, attempt: Attempt, dumps: StackDumps, executor: Executor,
                       now: float | None = None) -> None:
    """The UI's *Dump stacks* button: save every rank's stacks, kill nothing. Starts the dump on
    one tick and records it on a later one; the request stays until then (a scheduler restarted
    meanwhile starts it again)."""
    now = time.time() if now is None else now
    key = request_key(run.id, attempt.number)
    if not dumps.running(key):
        dumps.start(key, executor.stack_dump(run, attempt))
        return
    result = dumps.take(key)
    if result is None:
        return
    run.dump_requested_at = None
    message = result.summary() if isinstance(result, StackDump) else f"the stack dump failed: {result}"
    session.add(Event(run_id=run.id, attempt=attempt.number, at=now, kind="stacks", message=message))
