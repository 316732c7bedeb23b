"""The Run page's panels (app/run_panels.py): the Attempts table's cells say what happened in
words, never "None" (issue 56, item 2); a failed run's summary is one line (issue 56, item 10)."""

from __future__ import annotations

from typing import Any

from app.log_view import OWN_FRAME_ROOTS
from app.run_panels import attempt_row, failure_line, user_frame


def attempt(**fields: Any) -> dict[str, Any]:
    base = {"number": 1, "status": "RUNNING", "cause": None, "failed_rank": None, "exception": None,
            "resume_step": None, "last_step": None, "steps_lost": None, "exit_code": None, "started_at": 1000.0,
            "first_step_at": None, "ended_at": None, "retry_counted": None, "overrides": {}}
    return {**base, **fields}


def test_a_running_attempt_has_no_none_in_its_row() -> None:
    row = attempt_row(attempt())
    assert "None" not in " ".join(map(str, row.values()))
    assert (row["exit"], row["cause"], row["rank"], row["from step"], row["retry counted"], row["changes"]) == (
        "still running", "–", "–", 0, "–", "–")


def test_a_failed_attempt_says_its_cause_rank_exit_and_changes() -> None:
    row = attempt_row(attempt(status="FAILED", cause="OOM", failed_rank=1, exit_code=-9, steps_lost=5,
                              retry_counted=True, overrides={"train": {"batch_size": 32}}, ended_at=1100.0))
    assert (row["exit"], row["cause"], row["rank"], row["steps lost"], row["retry counted"], row["changes"]) == (
        "exit -9 (SIGKILL)", "OOM", "1", "5", "yes", "batch_size=32")
    assert attempt_row(attempt(status="CRASHED", cause="UNKNOWN", retry_counted=False))["exit"] == (
        "no exit code (killed or vanished)")


def traceback(*frames: str, error: str = "ValueError: lr too high") -> str:
    """A traceback as torchrun writes rank 1's stderr, its frames (file, line, function) in order."""
    lines = ["Traceback (most recent call last):"]
    for frame in frames:
        path, line, func = frame.split(":")
        lines += [f'  File "{path}", line {line}, in {func}', "    some_code()"]
    return "".join(f"[rank1]: {line}\n" for line in [*lines, error])


def test_a_failure_is_one_line_with_where_in_the_users_code_it_was_raised() -> None:
    trainer = OWN_FRAME_ROOTS[0]
    tail = traceback(f"{trainer}process/script_runner.py:88:main", "<frozen runpy>:291:run_path",
                     "/home/me/proj/train.py:12:<module>", "/home/me/proj/model.py:40:step",
                     "/usr/lib/python3/dist-packages/torch/nn/functional.py:3000:cross_entropy")
    assert user_frame(tail) == "model.py:40 in step"  # neither runyard's frames nor torch's
    failed = attempt(status="FAILED", cause="USER_ERROR", failed_rank=1, exception="ValueError: lr too high",
                     reason="rank 1 raised ValueError", log_tail=tail)
    assert failure_line(failed) == (r"**Attempt 1: rank 1 failed (USER_ERROR)**: ValueError\: lr too high "
                                    r"\(at model.py\:40 in step\)")
    # The scheduler's place is torch's: the user's frame is added; its own place is not repeated.
    deep = {**failed, "exception": "ValueError: lr too high (at torch/nn/functional.py:3000 in cross_entropy)"}
    assert failure_line(deep).endswith(r"in cross\_entropy\) \(from model.py\:40 in step\)")
    mine = {**failed, "exception": "ValueError: lr too high (at model.py:40 in step)"}
    assert failure_line(mine).count("model.py") == 1
    # One line however long the message, and without a traceback its exit code.
    long = failure_line({**failed, "exception": "RuntimeError: " + "x" * 500 + "\nsecond line", "log_tail": None})
    assert "\n" not in long and len(long) < 220
    assert failure_line({**failed, "exception": None, "reason": None, "exit_code": 1, "log_tail": None}).endswith(
        ": exit 1")


def test_a_failure_without_words_says_what_is_known() -> None:
    """An exception text of whitespace only, no reason, no exit code: one line all the same, never
    "None" and never an IndexError."""
    failed = attempt(status="FAILED", cause="UNKNOWN", failed_rank=0, exception=" \n\t", reason=None,
                     exit_code=-9, log_tail=None)
    assert failure_line(failed) == r"**Attempt 1: rank 0 failed (UNKNOWN)**: exit -9 \(SIGKILL\)"
    assert failure_line({**failed, "reason": "rank 0 was killed\n"}).endswith(": rank 0 was killed")
    vanished = {**failed, "status": "CRASHED", "exit_code": None, "failed_rank": None}
    assert failure_line(vanished) == (r"**Attempt 1: the attempt failed (UNKNOWN)**: "
                                       r"no exit code \(killed or vanished\)")
    assert "None" not in failure_line({**vanished, "status": "FAILED"})


def test_the_users_frame_is_the_failed_ranks_when_two_ranks_tracebacks_interleave() -> None:
    """torchrun interleaves every rank's stderr: rank 0's traceback (its frame last in the tail)
    must not be named as the place where rank 1 failed."""
    mine = traceback("/home/me/proj/train.py:12:<module>", "/home/me/proj/model.py:40:step").splitlines()
    other = [line.replace("[rank1]:", "[rank0]:") for line in traceback(
        "/home/me/proj/train.py:12:<module>", "/home/me/proj/data.py:7:load", error="KeyError: 3").splitlines()]
    tail = "\n".join(line for pair in zip(mine, other, strict=True) for line in pair)
    assert user_frame(tail, rank=1) == "model.py:40 in step"
    assert user_frame(tail, rank=0) == "data.py:7 in load"
    failed = attempt(status="FAILED", cause="USER_ERROR", failed_rank=1, exception="ValueError: lr too high",
                     reason=None, log_tail=tail)
    assert failure_line(failed).endswith(r"\(at model.py\:40 in step\)")
    # A log without torchrun's prefixes (one rank's own file) is that rank's.
    bare = "\n".join(line.split(": ", 1)[1] for line in mine)
    assert user_frame(bare, rank=1) == "model.py:40 in step"
