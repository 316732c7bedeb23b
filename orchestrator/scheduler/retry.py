"""The retry policy: retry what may pass next time, with exponential backoff and jitter; stop
at once on errors that will recur.

One counter per run across all attempts (``runs.retries_used``). Preemptions do not count.
A CUDA out-of-memory retries with half the micro-batch and twice the gradient accumulation, so
the effective batch is unchanged.

The policy is a table (:data:`RULES`): each row a :class:`Verdict` and the test of a
:class:`Case` under which it holds, the first that holds being the verdict; each verdict has its
sentence. :func:`verdict` and :func:`decide` are pure functions of plain values
(:class:`AttemptOutcome`); orchestrator/scheduler/outcomes.py reads them from the database and
applies the decision.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from db.vocabulary.causes import Cause, normalize_exception
from db.vocabulary.config import RetryConfig
from orchestrator.scheduler.failures import USAGE_REFUSED
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


# Failures that, raised again identically at the same step, will keep recurring.
REPEAT_FAILS = frozenset({Cause.USER_ERROR, Cause.DISK})


def same_exception(a: str | None, b: str | None) -> bool:
    """Whether two exception lines are the same error, ignoring their volatile parts (temporary
    names, addresses, pids, ports: db/vocabulary/causes.py ``normalize_exception``)."""
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


def halved_micro_batch(batch_size: int, grad_accum: int) -> dict[str, Any]:
    """Overrides after a CUDA OOM: half the micro-batch, twice the accumulation."""
    return {"train": {"batch_size": max(1, batch_size // 2), "grad_accum": grad_accum * 2}}


def backoff_s(retries_used: int, config: RetryConfig, rand: random.Random | None = None) -> float:
    """``backoff_s x 2^retries_used``, capped, times a jitter in [0.5, 1.0] so that runs that
    failed together do not come back together."""
    doublings: int = 2 ** retries_used  # int ** int is Any to the checker (a negative power is a float)
    base = min(config.backoff_max_s, config.backoff_s * doublings)
    return base * (0.5 + 0.5 * (rand or random).random())


class Verdict(Enum):
    """What the retry policy says of a failed attempt, and its sentence: the value, filled in with
    the case's words (:func:`decide`). Whether the run is tried again, and whether that spends a
    retry, are the verdict's own (:attr:`retries`, :attr:`counted`); :data:`RULES` says when each
    applies."""

    FALLBACK = "{fallback}: retry {next} of {max} in {delay:.0f} s"
    PREEMPTED_AGAIN_SPENT = (
        "preempted twice at step {step} without progress in between, and the retries are spent (retry.max_retries = "
        "{max}); give it more time (slurm.time_limit) or fewer steps between checkpoints, then resume")
    PREEMPTED_AGAIN = ("preempted again at step {step} with no progress since the last preemption: resuming, and this "
                       "one uses a retry")
    PREEMPTED = "preempted (SIGTERM from outside): resuming; this does not use a retry"
    RUN_DIR_DELETED = "{exception}"
    LAUNCH_REFUSED = ("the launch itself was refused: it would be refused again; change the settings the reason names, "
                      "then resume")
    USAGE_REFUSED = "{exception}: it would be refused again; fix the script's arguments (workload.args), then resume"
    BEFORE_FIRST_STEP = ("{raised} before the first step completed: it would fail again; fix the code or the config, "
                         "then resume")
    SAME_DISK_ERROR = ("the same disk error at the same step twice ({exception} after step {step}) although there was "
                       "room: a size limit or a quota; free space or raise the limit, then resume")
    SAME_EXCEPTION = ("the same exception twice ({exception}; the script reports no step, so runyard compares the "
                      "exception alone): retrying cannot help")
    SAME_EXCEPTION_SAME_STEP = ("the same exception at the same step twice ({exception} after step {step}): retrying "
                                "cannot help")
    REPLAYED = ("the same exception at the same place twice in a row ({exception}), and attempt {number} started from "
                "{start}: a third try would start there again and fail the same way, so it is not made; fix the code "
                "or the data it names, then resume")
    OOM_AT_ONE = "CUDA out of memory with a micro-batch of 1: lower the model size"
    RETRIES_SPENT = "{cause}: gave up after {used} retr{ies} (retry.max_retries = {max})"
    RETRY = "{cause}: retry {next} of {max} in {delay:.0f} s{what}"

    @property
    def retries(self) -> bool:
        """Whether the run is tried again."""
        return self in _RETRYING

    @property
    def counted(self) -> bool:
        """Whether the attempt counts against ``retry.max_retries`` (only a first preemption does not)."""
        return self is not Verdict.PREEMPTED

    @property
    def backs_off(self) -> bool:
        """Whether the next attempt waits out the backoff first."""
        return self.retries and self.counted


_RETRYING = frozenset({Verdict.FALLBACK, Verdict.PREEMPTED_AGAIN, Verdict.PREEMPTED, Verdict.RETRY})


@dataclass(frozen=True)
class Case:
    """What the policy judges, in plain values: the failed attempt, the one before it, the retries
    used and allowed, the ``[train]`` settings it ran with, and the words of a checkpoint fallback
    (orchestrator/scripts/checkpoint_loads.py), if there was one."""

    failed: AttemptOutcome
    last: AttemptOutcome | None
    retries_used: int
    max_retries: int
    train: Mapping[str, Any]
    fallback: str | None = None

    @property
    def spent(self) -> bool:
        return self.retries_used >= self.max_retries

    @property
    def preempted_again(self) -> bool:
        """Preempted again without a step of progress (a time limit shorter than the start-up and a
        save): resuming for free would loop for ever."""
        return (self.failed.cause is Cause.PREEMPTED and self.last is not None
                and self.last.cause is Cause.PREEMPTED and self.last.last_step == self.failed.last_step)

    @property
    def repeated(self) -> bool:
        """The failure that will keep recurring: the same exception (volatile parts aside) at the
        same step as the attempt before, for a cause in :data:`REPEAT_FAILS`. A mount read-only
        again is no size limit."""
        failed, last = self.failed, self.last
        return (failed.cause in REPEAT_FAILS and last is not None and last.cause is failed.cause
                and same_exception(last.exception, failed.exception) and last.last_step == failed.last_step
                and errno_in(failed.exception) != errno.EROFS)

    def is_(self, cause: Cause) -> bool:
        return self.failed.cause is cause


# The policy, one row a rule: the first whose test holds is the verdict. A new failure cause that
# needs a rule of its own is one row here and one Verdict with its sentence.
RULES: tuple[tuple[Verdict, Callable[[Case], bool]], ...] = (
    (Verdict.FALLBACK, lambda c: c.fallback is not None and not c.spent),
    (Verdict.PREEMPTED_AGAIN_SPENT, lambda c: c.preempted_again and c.spent),
    (Verdict.PREEMPTED_AGAIN, lambda c: c.preempted_again),
    (Verdict.PREEMPTED, lambda c: c.is_(Cause.PREEMPTED)),
    (Verdict.RUN_DIR_DELETED, lambda c: c.is_(Cause.RUN_DIR_DELETED)),
    (Verdict.LAUNCH_REFUSED, lambda c: c.is_(Cause.LAUNCH_FAILED)),
    (Verdict.USAGE_REFUSED, lambda c: c.is_(Cause.USER_ERROR) and (c.failed.exception or "").endswith(USAGE_REFUSED)),
    (Verdict.BEFORE_FIRST_STEP,
     lambda c: c.is_(Cause.USER_ERROR) and c.failed.last_step is None and c.failed.steps_known),
    (Verdict.SAME_DISK_ERROR, lambda c: c.repeated and c.is_(Cause.DISK)),
    (Verdict.SAME_EXCEPTION, lambda c: c.repeated and c.failed.last_step is None and not c.failed.steps_known),
    (Verdict.SAME_EXCEPTION_SAME_STEP, lambda c: c.repeated),
    (Verdict.REPLAYED, lambda c: replayed(c.failed, c.last)),
    # The next attempt's halved micro-batch is derived from this cause when it starts
    # (orchestrator/scheduler/outcomes.py's next_overrides): the one place it is computed.
    (Verdict.OOM_AT_ONE, lambda c: c.is_(Cause.CUDA_OOM) and int(c.train["batch_size"]) <= 1),
    (Verdict.RETRIES_SPENT, lambda c: c.spent),
    (Verdict.RETRY, lambda c: True),
)


def verdict(case: Case) -> Verdict:
    """The first rule of :data:`RULES` that holds for ``case``."""
    return next(found for found, holds in RULES if holds(case))


# What a retry waits for, by cause, beyond its backoff.
_RETRY_WHAT = {
    Cause.CUDA_OOM: " with half the micro-batch and twice the accumulation",
    Cause.DISK: " once the disk has room again and the run folder is writable (the scheduler checks both first)",
}


def _words(c: Case, delay_s: float) -> dict[str, object]:
    """The words a verdict's sentence is filled in with."""
    f = c.failed
    start = ("the beginning, having saved no checkpoint" if f.resumed_from is None else
             f"its checkpoint at step {f.resumed_from} and saved none past it")
    return {"cause": f.cause.value, "exception": f.exception, "raised": f.exception or "an exception",
            "step": f.last_step, "number": f.number, "start": start, "used": c.retries_used,
            "ies": "y" if c.retries_used == 1 else "ies", "next": c.retries_used + 1, "max": c.max_retries,
            "delay": delay_s, "what": _RETRY_WHAT.get(f.cause, ""), "fallback": c.fallback}


@dataclass(frozen=True)
class Decision:
    """A verdict with its sentence for this attempt, and how long the next one waits."""

    verdict: Verdict
    reason: str
    delay_s: float = 0.0

    @property
    def retry(self) -> bool:
        return self.verdict.retries

    @property
    def counted(self) -> bool:
        return self.verdict.counted


def decide(
    failed: AttemptOutcome,
    previous: list[AttemptOutcome],
    retries_used: int,
    config: RetryConfig,
    train: Mapping[str, Any],
    rand: random.Random | None = None,
    fallback: str | None = None,
) -> Decision:
    """Whether and when to try again: the :func:`verdict` of the case, with its sentence.

    Args:
        failed: the attempt that just failed.
        previous: earlier failed attempts of the run, oldest first.
        retries_used: counted retries so far.
        config: the run's ``[retry]`` section.
        train: the ``[train]`` settings the failed attempt ran with (after its overrides).
        rand: random source for the jitter (tests pass a seeded one).
        fallback: the words of a retry that failed loading its checkpoint and falls back to the
            one before (orchestrator/scripts/checkpoint_loads.py), or None.
    """
    case = Case(failed, previous[-1] if previous else None, retries_used, config.max_retries, train, fallback)
    found = verdict(case)
    delay = backoff_s(retries_used, config, rand) if found.backs_off else 0.0
    return Decision(found, found.value.format(**_words(case, delay)), delay)
