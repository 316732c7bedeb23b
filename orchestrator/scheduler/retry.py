"""The retry policy: retry what may pass next time, with exponential backoff and jitter; stop
at once on errors that will recur.

One counter per run across all attempts (``runs.retries_used``). Preemptions do not count.
A CUDA out-of-memory retries with half the micro-batch and twice the gradient accumulation, so
the effective batch is unchanged. :func:`decide` is a pure function of plain values
(:class:`AttemptOutcome`); orchestrator/scheduler/outcomes.py reads them from the database.
"""

from __future__ import annotations

import errno
import random
from dataclasses import dataclass
from typing import Any

from db.vocabulary.causes import Cause
from db.vocabulary.config import RetryConfig
from orchestrator.scheduler.failures import USAGE_REFUSED, normalize_exception
from orchestrator.scheduler.storage import errno_in


@dataclass(frozen=True)
class AttemptOutcome:
    """What the policy needs to know about one failed attempt."""

    number: int
    cause: Cause
    exception: str | None
    last_step: int | None  # the newest completed step (None: not one)
    # False for a script that reports no step (no SDK, RUNYARD line, stdout_metrics match or
    # TensorBoard scalar): its last_step None says nothing about how far it got.
    steps_known: bool = True
    resumed_from: int | None = None  # the step of the checkpoint it started from (None: the beginning)
    saved_at: int | None = None  # the newest step it saved a checkpoint of its own at (None: none)

    @property
    def progressed(self) -> bool:
        """Whether it saved a checkpoint past the one it started from: the next attempt starts further on."""
        return self.saved_at is not None and (self.resumed_from is None or self.saved_at > self.resumed_from)


@dataclass(frozen=True)
class Decision:
    retry: bool
    reason: str
    delay_s: float = 0.0
    counted: bool = True


# Failures that, raised again identically at the same step, will keep recurring.
REPEAT_FAILS = frozenset({Cause.USER_ERROR, Cause.DISK})


def same_exception(a: str | None, b: str | None) -> bool:
    """Whether two exception lines are the same error, ignoring their volatile parts (temporary
    names, addresses, pids, ports: orchestrator/scheduler/failures.py ``normalize_exception``)."""
    return a is not None and normalize_exception(a) == normalize_exception(b)


def replayed(failed: AttemptOutcome, last: AttemptOutcome | None) -> bool:
    """Whether ``failed`` is ``last``'s failure again, so that a third try would replay it: the
    same exception at the same place twice in a row with no progress (the rule behind "not worth a
    third try", whatever step each attempt last reported: a script that reports steps sparsely
    reports a different one each time).

    The rule: both are ``USER_ERROR`` with the same exception at the same place (the exception line
    with its innermost frame, ``ValueError: x (at crash.py:8 in main)``, volatile parts aside:
    :func:`same_exception`); ``failed`` saved no checkpoint past the one it started from (the next
    attempt would start where it started); and the state it started from had already led ``last``
    to the same exception: ``last`` started from the same checkpoint, or saved the one ``failed``
    started from (it trained through that state and on into the error), or made no progress either.

    Like is compared with like. An attempt that started from an older checkpoint than the one
    before it (the one before failed to load its own, which was then refused and the retry fell
    back to the previous one) did not replay ``last`` when ``last`` had made progress: ``last``
    trained from elsewhere, so the two prove nothing together and the retry goes on (the retries
    left bound it). When neither made progress, the same exception at the same place from two
    different checkpoints says the failure does not depend on the checkpoint: a third start, from
    any of them, fails the same way. An attempt that saved a checkpoint past its start is never a
    replay: the next one starts further on.
    """
    if last is None or failed.cause is not Cause.USER_ERROR or last.cause is not Cause.USER_ERROR:
        return False
    if not same_exception(last.exception, failed.exception) or failed.progressed:
        return False
    return not last.progressed or failed.resumed_from in (last.resumed_from, last.saved_at)


def _replay_reason(failed: AttemptOutcome) -> str:
    start = ("the beginning, having saved no checkpoint" if failed.resumed_from is None else
             f"its checkpoint at step {failed.resumed_from} and saved none past it")
    return (f"the same exception at the same place twice in a row ({failed.exception}), and attempt "
            f"{failed.number} started from {start}: a third try would start there again and fail the same "
            "way, so it is not made; fix the code or the data it names, then resume")


def halved_micro_batch(batch_size: int, grad_accum: int) -> dict[str, Any]:
    """Overrides after a CUDA OOM: half the micro-batch, twice the accumulation."""
    return {"train": {"batch_size": max(1, batch_size // 2), "grad_accum": grad_accum * 2}}


def backoff_s(retries_used: int, config: RetryConfig, rand: random.Random | None = None) -> float:
    """``backoff_s x 2^retries_used``, capped, times a jitter in [0.5, 1.0] so that runs that
    failed together do not come back together."""
    doublings: int = 2 ** retries_used  # int ** int is Any to the checker (a negative power is a float)
    base = min(config.backoff_max_s, config.backoff_s * doublings)
    return base * (0.5 + 0.5 * (rand or random).random())


def decide(
    failed: AttemptOutcome,
    previous: list[AttemptOutcome],
    retries_used: int,
    config: RetryConfig,
    train: dict[str, Any],
    rand: random.Random | None = None,
) -> Decision:
    """Whether and when to try again.

    Args:
        failed: the attempt that just failed.
        previous: earlier failed attempts of the run, oldest first.
        retries_used: counted retries so far.
        config: the run's ``[retry]`` section.
        train: the ``[train]`` settings the failed attempt ran with (after its overrides).
        rand: random source for the jitter (tests pass a seeded one).
    """
    last = previous[-1] if previous else None
    if failed.cause is Cause.PREEMPTED:
        if last is not None and last.cause is Cause.PREEMPTED and last.last_step == failed.last_step:
            # Preempted again without a step of progress (a time limit shorter than the start-up
            # and a save): resuming for free would loop for ever; this one counts.
            if retries_used >= config.max_retries:
                return Decision(False, f"preempted twice at step {failed.last_step} without progress in between, and "
                                       f"the retries are spent (retry.max_retries = {config.max_retries}); give it "
                                       "more time (slurm.time_limit) or fewer steps between checkpoints, then resume")
            return Decision(True, f"preempted again at step {failed.last_step} with no progress since the last "
                                  "preemption: resuming, and this one uses a retry", delay_s=backoff_s(retries_used,
                                                                                                     config, rand))
        return Decision(True, "preempted (SIGTERM from outside): resuming; this does not use a retry",
                        delay_s=0.0, counted=False)
    if failed.cause is Cause.RUN_DIR_DELETED:
        return Decision(False, f"{failed.exception}")
    if failed.cause is Cause.LAUNCH_FAILED:
        return Decision(False, "the launch itself was refused: it would be refused again; change the settings the "
                               "reason names, then resume")
    if failed.cause is Cause.USER_ERROR and (failed.exception or "").endswith(USAGE_REFUSED):
        return Decision(False, f"{failed.exception}: it would be refused again; fix the script's arguments "
                               "(workload.args), then resume")
    if failed.cause is Cause.USER_ERROR and failed.last_step is None and failed.steps_known:
        return Decision(False, f"{failed.exception or 'an exception'} before the first step completed: "
                               "it would fail again; fix the code or the config, then resume")
    if (failed.cause in REPEAT_FAILS and last is not None and last.cause is failed.cause
            and same_exception(last.exception, failed.exception) and last.last_step == failed.last_step
            and errno_in(failed.exception) != errno.EROFS):  # a mount read-only again is no size limit
        if failed.cause is Cause.DISK:
            return Decision(False, f"the same disk error at the same step twice ({failed.exception} after step "
                                   f"{failed.last_step}) although there was room: a size limit or a quota; "
                                   "free space or raise the limit, then resume")
        if failed.last_step is None and not failed.steps_known:
            return Decision(False, f"the same exception twice ({failed.exception}; the script reports no step, so "
                                   "runyard compares the exception alone): retrying cannot help")
        return Decision(False, f"the same exception at the same step twice ({failed.exception} after step "
                               f"{failed.last_step}): retrying cannot help")
    if replayed(failed, last):
        return Decision(False, _replay_reason(failed))
    # The next attempt's halved micro-batch is derived from this cause when it starts
    # (orchestrator/scheduler/outcomes.py's next_overrides): the one place it is computed.
    if failed.cause is Cause.CUDA_OOM and int(train["batch_size"]) <= 1:
        return Decision(False, "CUDA out of memory with a micro-batch of 1: lower the model size")
    if retries_used >= config.max_retries:
        return Decision(False, f"{failed.cause.value}: gave up after {retries_used} retr"
                               f"{'y' if retries_used == 1 else 'ies'} (retry.max_retries = {config.max_retries})")
    delay = backoff_s(retries_used, config, rand)
    what = " with half the micro-batch and twice the accumulation" if failed.cause is Cause.CUDA_OOM else ""
    if failed.cause is Cause.DISK:
        what = (" once the disk has room again and the run folder is writable (the scheduler checks both "
                "first)")
    return Decision(True, f"{failed.cause.value}: retry {retries_used + 1} of {config.max_retries} in "
                          f"{delay:.0f} s{what}", delay_s=delay)
