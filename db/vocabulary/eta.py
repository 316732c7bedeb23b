"""When a run ends, and what that is based on: the pace of its newest progress points, a band that
widens with the share of the run still to do, and, while it waits to retry or pauses, the restart it
is about to pay. SQL-free: db/run_summary.py reads the points and the attempts, this module does the
arithmetic and says it in words (docs/COSTS.md, "When a run ends").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from db.vocabulary.cost import ETA_WINDOW, eta_estimate, recent_pace

# The band around the estimate, as a share of the time left. Above it: BAND_BASE however far the run
# is, plus BAND_PER_LEFT times the share of its steps still to do (a run 10% done has extrapolated its
# pace over nine times the steps it measured; one 90% done over a ninth). Below it: as much, up to
# BAND_BELOW_MAX (a pace is lost to evaluations, other runs starting and retries more often and by
# more than it is gained). Tuned with bench/bench_eta.py on recorded runs so that the true end falls
# inside the band at least 80% of the time at 20, 50 and 80% done (BENCHMARKS.md, "ETA").
BAND_BASE = 0.20
BAND_PER_LEFT = 0.90
BAND_BELOW_MAX = 0.35
# A restart's own uncertainty: its measured start-ups vary by about this share.
RESTART_SPREAD = 0.5
MACHINE_RESTARTS = 20  # the newest restarts on this machine whose median stands in for a run's own


@dataclass(frozen=True)
class Restart:
    """The restart a run waiting to retry (or pausing) is about to pay, in seconds.

    Attributes:
        backoff_s: the backoff still to wait before the next attempt launches (0 while pausing).
        startup_s: launch to first step of the next attempt, as measured (``startup_source`` says where).
        startup_source: in words: "this run's own restarts", "the machine's median over 7 restarts".
        resume_step: the step of the checkpoint it will resume from (None: its newest step, as a
            pause saves one there; 0 from scratch).
        if_resumed: a pausing run: the restart comes only when a person resumes it.
    """

    backoff_s: float
    startup_s: float
    startup_source: str
    resume_step: int | None = None
    if_resumed: bool = False


@dataclass(frozen=True)
class Forecast:
    """Seconds until the last step, the band around it, and what it is based on (one sentence)."""

    seconds: float
    low: float
    high: float
    basis: str


def startup_of(own: Sequence[float], machine: Sequence[float], first: float | None) -> tuple[float, str] | None:
    """The launch-to-first-step a restart is expected to take, and where that comes from: the
    median of this run's own earlier restarts, else the machine's median over its newest
    :data:`MACHINE_RESTARTS` restarts, else this run's first start-up; None without any of them."""
    if own:
        return statistics.median(own), "this run's own restarts" if len(own) > 1 else "this run's own last restart"
    if machine:
        return statistics.median(machine), f"the machine's median over {len(machine)} recent restart(s)"
    if first is not None:
        return first, "this run's first start-up"
    return None


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    minutes, s = divmod(seconds, 60)
    return f"{minutes} min" if minutes >= 2 else (f"{minutes} min {s} s" if minutes else f"{s} s")


def band(seconds: float, step: int, max_steps: int, parts: tuple[float, float]) -> tuple[float, float]:
    """The band around ``seconds`` still to go at ``step`` of ``max_steps``: at least what the
    fastest and slowest parts of the window span (``parts``), widened with the share still to do."""
    left_share = max(0.0, min(1.0, (max_steps - step) / max_steps)) if max_steps else 1.0
    above = BAND_BASE + BAND_PER_LEFT * left_share
    below = min(BAND_BELOW_MAX, above)
    return min(parts[0], seconds * (1 - below)), max(parts[1], seconds * (1 + above))


def forecast(points: Sequence[tuple[int, float]], max_steps: int, restart: Restart | None = None) -> Forecast | None:
    """When a run ends, from rank 0's newest (step, wall_time) points of its newest attempt.

    Args:
        points: (step, wall_time) points, any order; the newest :data:`ETA_WINDOW` are used.
        max_steps: the run's total of steps.
        restart: the restart about to be paid (a run RETRYING or PAUSING: :func:`restart_ahead`),
            else None; a pausing run's estimate holds if it is resumed at once.

    Returns:
        The forecast, or None until there are two points with progress between them.
    """
    estimate = eta_estimate(points, max_steps)
    pace = recent_pace(points)
    if estimate is None or pace is None:
        return None
    window = sorted(points)[-ETA_WINDOW:]
    step = window[-1][0]
    steps, over = window[-1][0] - window[0][0], window[-1][1] - window[0][1]
    basis = (f"from the last {steps:,} steps' pace over {_duration(over)} ({pace:.3g} steps/s), "
             "evaluation and checkpoint pauses included")
    if restart is None:
        low, high = band(estimate.seconds, step, max_steps, (estimate.low, estimate.high))
        return Forecast(estimate.seconds, low, high, basis)
    resume = step if restart.resume_step is None else min(step, restart.resume_step)
    redo = step - resume
    training = max(0, max_steps - resume) / pace
    restart_s = restart.backoff_s + restart.startup_s
    low, high = band(training, resume, max_steps, (training, training))
    seconds = restart_s + training
    low += restart.backoff_s + restart.startup_s * (1 - RESTART_SPREAD)
    high += restart.backoff_s + restart.startup_s * (1 + RESTART_SPREAD)
    parts = [f"~{_duration(restart.startup_s)} to start again ({restart.startup_source})"]
    if restart.backoff_s > 0:
        parts.insert(0, f"{_duration(restart.backoff_s)} of backoff left")
    if redo > 0:
        parts.append(f"{redo:,} steps to redo from the checkpoint at step {resume:,}" if resume
                     else f"{redo:,} steps to redo from scratch (no checkpoint)")
    when = "if resumed at once, it " if restart.if_resumed else ""
    basis += f"; {when}includes a restart of ~{_duration(restart_s + redo / pace)}: {', '.join(parts)}"
    return Forecast(seconds, low, high, basis)


def restart_ahead(status: str, startups: Sequence[tuple[int, float]], retry_at: float | None, now: float,
                  machine_startups: Sequence[float], resume_step: int | None) -> Restart | None:
    """The restart a run is about to pay: while it is RETRYING (the backoff left until
    ``retry_at``, then a start-up, then the steps from ``resume_step``, the checkpoint it will resume
    from, 0 without one) or PAUSING (a start-up, if resumed at once, from the step the pause saves);
    None in any other state or before anything says how long a start-up takes.

    Args:
        status: the run's status.
        startups: (attempt number, launch to first step) of each of its attempts that trained.
        retry_at: when the next attempt launches (RETRYING).
        now: the time the backoff left is counted from.
        machine_startups: launch-to-first-step of the machine's newest restarts (any run).
        resume_step: the step of the run's newest usable checkpoint, None without one.
    """
    if status not in ("RETRYING", "PAUSING"):
        return None
    own = [s for number, s in startups if number > 1]  # a resume after a pause is a restart too
    first = next((s for number, s in startups if number == 1), None)
    startup = startup_of(own, machine_startups, first)
    if startup is None:
        return None
    if status == "PAUSING":
        return Restart(backoff_s=0.0, startup_s=startup[0], startup_source=startup[1], if_resumed=True)
    backoff = max(0.0, retry_at - now) if retry_at is not None else 0.0
    return Restart(backoff_s=backoff, startup_s=startup[0], startup_source=startup[1], resume_step=resume_step or 0)
