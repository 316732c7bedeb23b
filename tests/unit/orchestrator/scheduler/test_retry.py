"""The retry policy as a table: each row a failed attempt (its cause, exception, last step), what
came before it, and what the policy must answer. Runs in milliseconds; the same rules are seen end
to end with real torchrun ranks in tests/integration/test_failures.py and tests/faults/.
"""

from __future__ import annotations

import random

import pytest

from db.vocabulary.causes import Cause
from db.vocabulary.config import RetryConfig
from orchestrator.scheduler.retry import (
    RULES,
    AttemptOutcome,
    Case,
    Verdict,
    backoff_s,
    decide,
    halved_micro_batch,
    verdict,
)

RAISED = "ValueError: loss went NaN (at train.py:24 in step)"
DISK_ERROR = "OSError: [Errno 28] No space left on device: '/data/run/checkpoints/.tmp-step-40-{}'"
CRASH = "ValueError: bad record 812 (at crash.py:8 in main)"
CONFIG = RetryConfig(max_retries=3, backoff_s=10, backoff_max_s=60)
TRAIN = {"batch_size": 32, "grad_accum": 1}


def outcome(cause: Cause, exception: str | None = None, last_step: int | None = 100, number: int = 2,
            resumed: int | None = None, saved: int | None = None) -> AttemptOutcome:
    return AttemptOutcome(number, cause, exception, last_step, resumed_from=resumed, saved_at=saved)


def crash(last_step: int, number: int = 2, resumed: int | None = None, saved: int | None = None) -> AttemptOutcome:
    """A script's deterministic ValueError, after reporting ``last_step`` (sparsely: it differs)."""
    return outcome(Cause.USER_ERROR, CRASH, last_step, number, resumed, saved)


def plain(exception: str, number: int = 2) -> AttemptOutcome:
    """A failed attempt of a script that reported no step."""
    return AttemptOutcome(number, Cause.USER_ERROR, exception, None, steps_known=False)


ROWS = [
    # (what happened, failed, previous, retries used, retry?, counted?, the reason says)
    ("a preemption never spends a retry", outcome(Cause.PREEMPTED), [], 3, True, False, "does not use a retry"),
    ("an exception before the first step recurs", outcome(Cause.USER_ERROR, RAISED, None), [], 0, False, True,
     "before the first step completed"),
    # A script that reports no step: its last_step None is no "before the first step".
    ("a plain script's first exception is retried", plain(RAISED), [], 0, True, True, "retry 1 of 3"),
    ("a plain script's same exception twice stops", plain(RAISED), [plain(RAISED, 1)], 1, False, True,
     "the same exception twice (ValueError: loss went NaN (at train.py:24 in step); the script reports no step"),
    ("a plain script's other exception is retried", plain("KeyError: 'x' (at a.py:1 in f)"), [plain(RAISED, 1)], 1,
     True, True, "retry 2 of 3"),
    ("a first exception after some steps is retried", outcome(Cause.USER_ERROR, RAISED, 120), [], 0, True, True,
     "retry 1 of 3"),
    ("the same exception at the same step twice stops", outcome(Cause.USER_ERROR, RAISED, 120),
     [outcome(Cause.USER_ERROR, RAISED, 120, 1)], 1, False, True, "the same exception at the same step twice"),
    ("the same exception past a checkpoint of its own is retried", crash(150, resumed=100, saved=140),
     [crash(120, 1, saved=100)], 1, True, True, "retry 2 of 3"),
    # The same exception at the same place twice in a row with no progress past the checkpoint it
    # started from, whatever step each last reported (issue 52, item 3).
    ("the same exception from the beginning twice, steps reported sparsely, stops", crash(20), [crash(30, 1)], 1,
     False, True, f"the same exception at the same place twice in a row ({CRASH}), and attempt 2 started from "
     "the beginning, having saved no checkpoint: a third try would start there again"),
    ("the same exception from the same checkpoint twice stops", crash(120, resumed=100), [crash(130, 1, resumed=100)],
     1, False, True, "attempt 2 started from its checkpoint at step 100 and saved none past it"),
    ("the same exception from the checkpoint the one before saved stops", crash(110, resumed=100),
     [crash(130, 1, saved=100)], 1, False, True, "fix the code or the data it names, then resume"),
    # Checkpoint custody's fallback: the one before could not load its checkpoint and the retry
    # started from an older one; like is compared with like.
    ("from an older checkpoint than the one before, which progressed, is retried", crash(60, 3, resumed=50),
     [crash(160, 2, resumed=100, saved=150)], 2, True, True, "retry 3 of 3"),
    ("from two checkpoints, neither progressing, stops", crash(60, 3, resumed=50), [crash(160, 2, resumed=150)], 2,
     False, True, "attempt 3 started from its checkpoint at step 50"),
    ("a disk error is not judged by this rule", outcome(Cause.DISK, DISK_ERROR.format("ab12"), 40),
     [outcome(Cause.DISK, DISK_ERROR.format("9f0e"), 30, 1)], 1, True, True, "once the disk has room again"),
    ("another exception at the same step is retried", outcome(Cause.USER_ERROR, "KeyError: 'x' (at a.py:1 in f)", 120),
     [outcome(Cause.USER_ERROR, RAISED, 120, 1)], 1, True, True, "retry 2 of 3"),
    ("the same disk error twice (temporary names differ) stops", outcome(Cause.DISK, DISK_ERROR.format("ab12"), 40),
     [outcome(Cause.DISK, DISK_ERROR.format("9f0e"), 40, 1)], 1, False, True, "a size limit or a quota"),
    ("a first disk error waits for room", outcome(Cause.DISK, DISK_ERROR.format("ab12"), 40), [], 0, True, True,
     "once the disk has room again"),
    ("a CUDA OOM retries with half the micro-batch", outcome(Cause.CUDA_OOM, "OutOfMemoryError"), [], 0, True, True,
     "half the micro-batch"),
    ("a segfault is retried", outcome(Cause.SEGFAULT), [], 2, True, True, "retry 3 of 3"),
    ("retries run out", outcome(Cause.COMM, "DistNetworkError"), [], 3, False, True, "gave up after 3 retries"),
    ("a hang is retried", outcome(Cause.HANG), [], 0, True, True, "HANG: retry 1 of 3"),
    ("a vanished launcher is retried", outcome(Cause.VANISHED), [outcome(Cause.VANISHED, number=1)], 1, True, True,
     "VANISHED: retry 2 of 3"),
]


@pytest.mark.parametrize(("name", "failed", "previous", "used", "retry", "counted", "says"), ROWS,
                         ids=[row[0] for row in ROWS])
def test_the_retry_policy(name: str, failed: AttemptOutcome, previous: list[AttemptOutcome], used: int,
                          retry: bool, counted: bool, says: str) -> None:
    decision = decide(failed, previous, used, CONFIG, TRAIN, random.Random(0))
    assert (decision.retry, decision.counted) == (retry, counted), decision.reason
    assert says in decision.reason
    if retry and counted:
        assert 5 <= decision.delay_s <= 60  # the backoff with its jitter, within the cap
    if not retry:
        assert decision.delay_s == 0


def test_a_cuda_oom_with_a_micro_batch_of_one_stops() -> None:
    decision = decide(outcome(Cause.CUDA_OOM), [], 0, CONFIG, {"batch_size": 1, "grad_accum": 4})
    assert not decision.retry and "micro-batch of 1" in decision.reason
    assert halved_micro_batch(32, 2) == {"train": {"batch_size": 16, "grad_accum": 4}}
    assert halved_micro_batch(1, 1) == {"train": {"batch_size": 1, "grad_accum": 2}}


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    rand = random.Random(1)
    delays = [backoff_s(n, CONFIG, rand) for n in range(6)]
    bases = [10, 20, 40, 60, 60, 60]
    assert all(base / 2 <= d <= base for d, base in zip(delays, bases, strict=True)), delays


# -- the verdicts, rule by rule: each row a Case and the Verdict the table gives -----------------

OOM = outcome(Cause.CUDA_OOM, "OutOfMemoryError")
READ_ONLY = "OSError: [Errno 30] Read-only file system: '/data/run/checkpoints/.tmp-step-40-{}'"


def case(failed: AttemptOutcome, last: AttemptOutcome | None = None, used: int = 0, train: dict | None = None,
         fallback: str | None = None) -> Case:
    return Case(failed, last, used, CONFIG.max_retries, TRAIN if train is None else train, fallback)


VERDICT_ROWS = [
    # (what happened, the case, the verdict)
    ("a retry that could not load its checkpoint falls back", case(crash(0, 3), fallback="attempt 3 could not load"),
     Verdict.FALLBACK),
    ("a fallback with the retries spent is judged as any failure", case(crash(0, 3), used=3, fallback="x"),
     Verdict.RETRIES_SPENT),
    ("preempted", case(outcome(Cause.PREEMPTED), used=3), Verdict.PREEMPTED),
    ("preempted twice at the same step", case(outcome(Cause.PREEMPTED), outcome(Cause.PREEMPTED, number=1)),
     Verdict.PREEMPTED_AGAIN),
    ("preempted twice at the same step, retries spent",
     case(outcome(Cause.PREEMPTED), outcome(Cause.PREEMPTED, number=1), used=3), Verdict.PREEMPTED_AGAIN_SPENT),
    ("preempted again after progress", case(outcome(Cause.PREEMPTED), outcome(Cause.PREEMPTED, last_step=50)),
     Verdict.PREEMPTED),
    ("the run folder deleted", case(outcome(Cause.RUN_DIR_DELETED, "the run folder /x was deleted")),
     Verdict.RUN_DIR_DELETED),
    ("the launch refused", case(outcome(Cause.LAUNCH_FAILED, "Slurm would never start job 7")),
     Verdict.LAUNCH_REFUSED),
    ("argparse refused the command line",
     case(outcome(Cause.USER_ERROR, "train.py: error: unrecognized arguments: --lf 0.1 (exit code 2: the script "
                                    "refused its command line)", None)), Verdict.USAGE_REFUSED),
    ("an exception before the first step", case(outcome(Cause.USER_ERROR, RAISED, None)), Verdict.BEFORE_FIRST_STEP),
    ("the same disk error at the same step", case(outcome(Cause.DISK, DISK_ERROR.format("a"), 40),
                                                  outcome(Cause.DISK, DISK_ERROR.format("b"), 40, 1)),
     Verdict.SAME_DISK_ERROR),
    ("a mount read-only again is no size limit", case(outcome(Cause.DISK, READ_ONLY.format("a"), 40),
                                                      outcome(Cause.DISK, READ_ONLY.format("b"), 40, 1)),
     Verdict.RETRY),
    ("the same exception twice from a script that reports no step", case(plain(RAISED), plain(RAISED, 1)),
     Verdict.SAME_EXCEPTION),
    ("the same exception at the same step", case(outcome(Cause.USER_ERROR, RAISED, 120),
                                                 outcome(Cause.USER_ERROR, RAISED, 120, 1)),
     Verdict.SAME_EXCEPTION_SAME_STEP),
    ("the same exception at the same place with no progress", case(crash(20), crash(30, 1)), Verdict.REPLAYED),
    ("a CUDA OOM with a micro-batch of 1", case(OOM, train={"batch_size": 1, "grad_accum": 4}), Verdict.OOM_AT_ONE),
    ("a CUDA OOM", case(OOM), Verdict.RETRY),
    ("retries spent", case(outcome(Cause.SEGFAULT), used=3), Verdict.RETRIES_SPENT),
    ("a hang", case(outcome(Cause.HANG)), Verdict.RETRY),
]


@pytest.mark.parametrize(("name", "judged", "expected"), VERDICT_ROWS, ids=[row[0] for row in VERDICT_ROWS])
def test_each_rule_of_the_policy(name: str, judged: Case, expected: Verdict) -> None:
    assert verdict(judged) is expected


def test_every_verdict_has_a_rule_and_says_whether_it_retries() -> None:
    assert [v for v, _ in RULES] == list(Verdict)  # the table in the enum's order, each once
    assert {row[2] for row in VERDICT_ROWS} == set(Verdict)  # and every one has a row above
    retried = {v for v in Verdict if v.retries}
    assert retried == {Verdict.FALLBACK, Verdict.PREEMPTED_AGAIN, Verdict.PREEMPTED, Verdict.RETRY}
    assert [v for v in Verdict if not v.counted] == [Verdict.PREEMPTED]
    for v in Verdict:  # the sentence of each; only a counted retry waits out a backoff
        judged = next(row[1] for row in VERDICT_ROWS if row[2] is v)
        decision = decide(judged.failed, [judged.last] if judged.last is not None else [], judged.retries_used,
                          CONFIG, judged.train, random.Random(0), judged.fallback)
        assert decision.verdict is v and decision.reason
        assert (decision.delay_s > 0) == v.backs_off
