"""The hang watchdog: an attempt with no completed step for too long is hung. Evidence first
(every rank's stacks), then the kill, then the retry policy."""

from __future__ import annotations

import logging
import math
import signal
import statistics
import time
from pathlib import Path

from sqlalchemy.orm import Session

from db import metricstore
from db.models import Attempt, Event, Run
from orchestrator.supervision import dump_stacks, signal_attempt
from trainer.config import SupervisionConfig

logger = logging.getLogger(__name__)

# Time the ranks get to write their stacks between SIGUSR1 and SIGKILL.
STACKS_WAIT_S = 2.0


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
          now: float | None = None) -> None:
    """Call for a live attempt on every tick: detects a hang, saves stacks, then kills.

    ``script``: the run is the user's own script, which may never report a step.
    """
    now = time.time() if now is None else now
    if attempt.hang_detected_at is None:
        if attempt.first_step_at is None and script:
            return  # a script may not use the SDK: without progress reports there is no hang to see
        if attempt.first_step_at is None:
            since, threshold = attempt.started_at, config.startup_timeout_s
        elif attempt.phase == "finishing":
            since, threshold = attempt.progress_at or attempt.started_at, config.startup_timeout_s
        else:
            since = attempt.progress_at or attempt.first_step_at
            if now - since <= config.hang_timeout_s:
                return  # the threshold is never below hang_timeout_s: no need to read step times
            threshold = hang_threshold_s(session, run.id, attempt.number, config)
        if now - since <= threshold:
            return
        stacks = dump_stacks(run.run_dir, attempt.number, attempt.pid, attempt.pid_create_time, Path(attempt.dir))
        attempt.hang_detected_at = now
        attempt.stop_reason = "hang"
        what = "no step completed" if attempt.first_step_at else "no first step"
        session.add(Event(run_id=run.id, attempt=attempt.number, at=now, level="error", kind="hang",
                          message=f"hang: {what} for {now - since:.0f} s (threshold {threshold:.0f} s) after step "
                                  f"{attempt.last_step or 0}; stacks of every rank saved in {Path(attempt.dir) / 'stacks'} "
                                  f"({len(stacks)} file(s)); killing the attempt"))
        logger.warning("run %d attempt %d: hang detected; stacks saved", run.id, attempt.number)
    elif attempt.signal_sent != "SIGKILL" and now - attempt.hang_detected_at >= STACKS_WAIT_S:
        signal_attempt(run.run_dir, attempt.number, attempt.pid, attempt.pid_create_time, signal.SIGKILL)
        attempt.signal_sent, attempt.signal_sent_at = "SIGKILL", now


def serve_dump_request(session: Session, run: Run, attempt: Attempt, now: float | None = None) -> None:
    """The UI's *Dump stacks* button: save every rank's stacks, kill nothing."""
    now = time.time() if now is None else now
    stacks = dump_stacks(run.run_dir, attempt.number, attempt.pid, attempt.pid_create_time, Path(attempt.dir))
    run.dump_requested_at = None
    session.add(Event(run_id=run.id, attempt=attempt.number, at=now, kind="stacks",
                      message=f"stacks of every rank saved in {Path(attempt.dir) / 'stacks'} ({len(stacks)} file(s))"))
