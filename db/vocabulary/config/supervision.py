"""[retry] and [supervision]: what happens when an attempt fails, hangs or straggles."""

from __future__ import annotations

from pydantic import Field, field_validator

from db.vocabulary.config.base import INT64_MAX, _Section


class RetryConfig(_Section):
    """What happens when an attempt fails."""

    max_retries: int = Field(default=3, ge=0, le=INT64_MAX)
    """New attempts after failures, counted over the whole run. Preemptions (a SIGTERM that
    runyard did not send) do not count. Errors that would recur stop the run at once."""

    backoff_s: float = Field(default=5.0, ge=0, allow_inf_nan=False)
    """Wait before the first retry; doubled for each further retry, with jitter."""

    backoff_max_s: float = Field(default=300.0, ge=0, allow_inf_nan=False)
    """Upper bound of the wait between attempts."""


class SupervisionConfig(_Section):
    """How the scheduler watches a running attempt."""

    hang_timeout_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    """An attempt with no completed step for max(hang_timeout_s, hang_step_factor x p95 step
    time) is hung: the stacks of every rank are saved, then it is killed and retried."""

    hang_step_factor: float = Field(default=20.0, gt=0, allow_inf_nan=False)
    """See hang_timeout_s: slow steps raise the threshold so a slow run is not called hung."""

    startup_timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    """An attempt whose first step has not completed this long after launch is hung (start-up:
    imports, rendezvous, data loading, compilation); the same allowance covers the final save
    and tear-down after the last step."""

    grace_s: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    """On cancel, pause or preemption the ranks get SIGTERM, finish the step and the next
    (the ranks agree to stop one step late, at the same step), write a checkpoint and exit;
    after this many seconds they get SIGKILL."""

    straggler_ratio: float = Field(default=1.2, ge=0, allow_inf_nan=False)
    """A rank whose time to the gradient sync (its own work between two DDP gradient all-reduces:
    data wait, optimizer, forward, backward up to the first gradient bucket) stays above this
    multiple of the other ranks' median (and by 5 ms or more) over `straggler_window_steps`
    steps, and for that many steps again and `straggler_sustain_s` seconds, is reported once as a
    straggler (a warning event). 0: off; otherwise above 1. Not measured under FSDP."""

    straggler_window_steps: int = Field(default=20, ge=1, le=INT64_MAX)
    """Steps the straggler check takes medians over, and how many steps a rank must stay slow."""

    straggler_sustain_s: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    """Seconds a rank must also stay slow before it is called a straggler (and fine again before
    the episode ends). On a busy machine which rank is slow moves every few seconds; a slow device
    or a rank's slow data loader stays."""

    desync_check_every: int = Field(default=100, ge=0, le=INT64_MAX)
    """Every this many steps the ranks compare a checksum of their parameters (exact: the raw
    bits summed as integers), carried in the metrics all-gather. DDP replicas must agree bit for
    bit; a rank that differs from rank 0 is reported as an error event. 0: off. Skipped under
    FSDP, where every rank holds a different shard."""

    @field_validator("straggler_ratio")
    @classmethod
    def _off_or_above_one(cls, ratio: float) -> float:
        if 0 < ratio <= 1:
            raise ValueError("must be 0 (off) or above 1")
        return ratio
