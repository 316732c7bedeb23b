"""orchestrator/scheduler/failures.py over captured torchrun logs: a plain script's exception survives the
``[rankN]:`` prefix, torchrun's failure summary and ``@record`` error files, names the rank and
the place, and "the same exception at the same place twice" stops the retries.

The fixtures under tests/fixtures/torchrun/<case>/ are real attempt folders (launcher log,
per-rank logs, error files) of tests/scripts/fail_cases.py under 2-rank torchrun, trimmed;
``python -m tests.fixtures.torchrun.capture`` writes them again.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from db.vocabulary.causes import Cause
from db.vocabulary.config import RetryConfig
from orchestrator.executors.logs import launcher_log, rank_log_files
from orchestrator.scheduler.failures import classify, parse_traceback, rank_failures, strip_rank_prefix
from orchestrator.scheduler.retry import AttemptOutcome, decide
from tests.fixtures.torchrun.capture import HERE, materialize

RAISED = "ValueError: loss went NaN at step 50"
PLACE = "fail_cases.py:24 in scale_gradients"

# case: (cause, rank, exception, location)
EXPECTED = {
    "raise_rank1": (Cause.USER_ERROR, 1, f"{RAISED} (at {PLACE})", PLACE),
    "record": (Cause.USER_ERROR, 1, f"{RAISED} (at {PLACE})", PLACE),
    "segfault": (Cause.SEGFAULT, 1, "killed by SIGSEGV", None),
    "exit3": (Cause.UNKNOWN, 1, "exit code 3", None),
    # Rank 0 raised inside broadcast; rank 1's "Connection closed by peer" is the fallout.
    "collective_raise": (
        Cause.USER_ERROR, 0,
        "RuntimeError: ProcessGroupGloo::broadcast: invalid root rank: 2 "
        "(at torch/distributed/distributed_c10d.py:3145 in broadcast)",
        "torch/distributed/distributed_c10d.py:3145 in broadcast",
    ),
}


def attempt(case: str, tmp_path: Path) -> Path:
    return materialize(HERE / case, tmp_path / case)


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_captured_torchrun_failures_classify(case: str, tmp_path: Path) -> None:
    failure = classify(attempt(case, tmp_path), 1)
    assert (failure.cause, failure.rank, failure.exception, failure.location) == EXPECTED[case]
    assert failure.summary().startswith(f"{EXPECTED[case][0].value} on rank {EXPECTED[case][1]}")


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_log_tail_is_the_failing_ranks_stderr(case: str, tmp_path: Path) -> None:
    failure = classify(attempt(case, tmp_path), 1)
    if case in ("segfault", "exit3"):  # the rank died without a word on stderr
        assert failure.log_tail == ""
    else:
        assert f"[rank{failure.rank}]: Traceback" in failure.log_tail


def test_the_failure_summary_names_torchruns_first_observed_failure(tmp_path: Path) -> None:
    failures = {f.rank: f for f in rank_failures(attempt("raise_rank1", tmp_path))}
    assert failures[1].root and failures[1].exitcode == 1 and failures[1].message is None  # no @record
    assert not failures[0].root and failures[0].exitcode == -15
    assert failures[1].local_rank == 1


def test_a_launcher_log_cut_short_still_names_the_failed_rank(tmp_path: Path) -> None:
    folder = attempt("exit3", tmp_path)
    text = launcher_log(folder).read_text()
    launcher_log(folder).write_text(text[:text.rindex("error_file: <N/A>") + len("error_file: <N/A>")])
    failure = classify(folder, 1)
    assert (failure.cause, failure.rank, failure.exception) == (Cause.UNKNOWN, 1, "exit code 3")


def test_record_error_file_gives_the_exception_and_its_place(tmp_path: Path) -> None:
    failures = {f.rank: f for f in rank_failures(attempt("record", tmp_path))}
    assert failures[1].message == RAISED and failures[1].location == PLACE
    assert failures[1].traceback is not None and "scale_gradients" in failures[1].traceback


def test_summary_traceback_stands_in_for_a_missing_error_file(tmp_path: Path) -> None:
    folder = attempt("record", tmp_path)
    for error_file in folder.rglob("error.json"):
        error_file.unlink()
    for stderr in folder.rglob("stderr.log"):
        stderr.write_text("")  # nor can the stderr help
    failure = classify(folder, 1)
    assert (failure.cause, failure.rank, failure.exception) == (Cause.USER_ERROR, 1, f"{RAISED} (at {PLACE})")


def test_without_a_summary_every_ranks_stderr_is_read(tmp_path: Path) -> None:
    folder = attempt("raise_rank1", tmp_path)
    launcher_log(folder).write_text("")  # torchrun itself was killed before it could print one
    failure = classify(folder, 1)
    # Rank 0's broken collective is fallout; rank 1's exception is the cause.
    assert (failure.cause, failure.rank, failure.exception) == (Cause.USER_ERROR, 1, f"{RAISED} (at {PLACE})")


def test_stderr_is_read_from_its_end_not_whole(tmp_path: Path) -> None:
    folder = attempt("raise_rank1", tmp_path)
    stderr = next(p for p in rank_log_files(folder)[1] if p.name == "stderr.log")
    original = stderr.read_text()
    # A long run's chatter (a progress bar on stderr), then the traceback.
    stderr.write_text("[rank1]: 12%|#2        | 120/1000 [00:01<00:09, 97.1it/s]\n" * 40_000 + original)
    assert stderr.stat().st_size > 2_000_000
    assert classify(folder, 1).exception == f"{RAISED} (at {PLACE})"


def test_a_rank_that_aborts_after_its_exception_is_the_exception(tmp_path: Path) -> None:
    # Seen in CI: rank 1 raised, then its interpreter aborted on exit ("terminate called without
    # an active exception", a gloo thread still running), so torchrun recorded SIGABRT.
    folder = attempt("raise_rank1", tmp_path)
    log = launcher_log(folder)
    text = log.read_text()
    root = text.rindex("exitcode  : 1 (pid: 30368)")
    log.write_text(text[:root] + "exitcode  : -6 (pid: 30368)  (SIGABRT)"
                   + text[root + len("exitcode  : 1 (pid: 30368)"):].replace(
                       "traceback : To enable traceback", "traceback : Signal 6 (SIGABRT) received by PID 30368\n#", 1))
    stderr = next(p for p in rank_log_files(folder)[1] if p.name == "stderr.log")
    stderr.write_text(stderr.read_text() + "\n[rank1]: terminate called without an active exception\n")
    assert {f.rank: f.exitcode for f in rank_failures(folder)} == {0: -15, 1: -6}
    failure = classify(folder, 1)
    assert (failure.cause, failure.rank, failure.exception, failure.location) == EXPECTED["raise_rank1"]


def test_a_rank_that_aborts_without_a_traceback_is_the_signal(tmp_path: Path) -> None:
    folder = attempt("exit3", tmp_path)
    log = launcher_log(folder)
    log.write_text(log.read_text().replace("exitcode  : 3 ", "exitcode  : -6 "))
    failure = classify(folder, 1)
    assert (failure.cause, failure.rank, failure.exception) == (Cause.SIGNAL, 1, "killed by SIGABRT")


def test_a_command_line_refused_by_argparse_is_a_user_error_not_retried(tmp_path: Path) -> None:
    """A plain script run with an argument it does not know exits 2 after argparse's usage: the
    refusal is the story, and retrying would be refused the same way (it was UNKNOWN, retried)."""
    folder = attempt("exit3", tmp_path)
    log = launcher_log(folder)
    log.write_text(log.read_text().replace("exitcode  : 3 ", "exitcode  : 2 "))
    stderr = next(p for p in rank_log_files(folder)[1] if p.name == "stderr.log")
    stderr.write_text("[rank1]: usage: train.py [-h] [--lr LR] [--epochs EPOCHS]\n"
                      "[rank1]: train.py: error: unrecognized arguments: --lf 0.1\n")
    failure = classify(folder, 1)
    assert (failure.cause, failure.rank) == (Cause.USER_ERROR, 1)
    assert failure.exception == ("train.py: error: unrecognized arguments: --lf 0.1 "
                                 "(exit code 2: the script refused its command line)")
    decision = decide(AttemptOutcome(1, failure.cause, failure.exception, None, steps_known=False), [],
                      retries_used=0, config=RetryConfig(max_retries=3), train={})
    assert not decision.retry and "workload.args" in decision.reason

    # Exit code 2 without argparse's usage before it stays what it was: an exit code.
    stderr.write_text("[rank1]: something else went wrong\n")
    assert (classify(folder, 1).cause, classify(folder, 1).exception) == (Cause.UNKNOWN, "exit code 2")


def test_the_same_exception_at_the_same_place_twice_stops_retrying(tmp_path: Path) -> None:
    def outcome(number: int, case: str) -> AttemptOutcome:
        failure = classify(attempt(case, tmp_path / str(number)), 1)
        return AttemptOutcome(number, failure.cause, failure.exception, 49)

    first, second = outcome(1, "raise_rank1"), outcome(2, "record")  # without and with @record
    decision = decide(second, [first], retries_used=1, config=RetryConfig(max_retries=5), train={},
                      rand=random.Random(0))
    assert not decision.retry and "same exception" in decision.reason


def test_the_same_exception_at_another_place_is_retried(tmp_path: Path) -> None:
    folder = attempt("raise_rank1", tmp_path / "moved")
    stderr = next(p for p in rank_log_files(folder)[1] if p.name == "stderr.log")
    stderr.write_text(stderr.read_text().replace("line 24, in scale_gradients", "line 31, in clip_gradients"))
    moved = classify(folder, 1)
    assert moved.location == "fail_cases.py:31 in clip_gradients"
    first = classify(attempt("raise_rank1", tmp_path / "first"), 1)
    decision = decide(AttemptOutcome(2, moved.cause, moved.exception, 49),
                      [AttemptOutcome(1, first.cause, first.exception, 49)],
                      retries_used=1, config=RetryConfig(max_retries=5), train={}, rand=random.Random(0))
    assert decision.retry, decision.reason


# -- the traceback parser on its own ----------------------------------------------------------

CHAINED = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/data/train.py", line 10, in load
[rank1]:     return table[key]
[rank1]:            ~~~~~^^^^^
[rank1]: KeyError: 'lr'
[rank1]:
[rank1]: During handling of the above exception, another exception occurred:
[rank1]:
[rank1]: Traceback (most recent call last):
[rank1]:   File "/data/train.py", line 12, in load
[rank1]:     raise RuntimeError("bad config")
[rank1]: RuntimeError: bad config
"""


def test_the_first_traceback_is_the_cause() -> None:
    raised = parse_traceback(CHAINED)
    assert raised is not None
    assert (raised.exception, raised.location) == ("KeyError: 'lr'", "train.py:10 in load")
    assert raised.traceback.startswith("Traceback (most recent call last):") and "[rank1]" not in raised.traceback


def test_a_cpp_warning_inside_a_traceback_is_not_the_exception() -> None:
    text = ('[rank0]: Traceback (most recent call last):\n[rank0]:   File "/x/a.py", line 3, in <module>\n'
            "[rank0]:[W1124 04:49:46.99 ProcessGroupGloo.cpp:12] Warning: something\n"
            "[rank0]:     f()\n[rank0]: ZeroDivisionError: division by zero\n")
    raised = parse_traceback(text)
    assert raised is not None and raised.exception == "ZeroDivisionError: division by zero"
    assert raised.location == "a.py:3 in <module>"


@pytest.mark.parametrize("text", [
    "",
    "plain output\nno traceback here\n",
    '[rank0]: Traceback (most recent call last):\n[rank0]:   File "/x/a.py", line 3, in f\n',  # cut off
])
def test_no_complete_traceback_is_none(text: str) -> None:
    assert parse_traceback(text) is None


def test_an_exception_without_a_message_and_a_frame_without_a_function() -> None:
    text = 'Traceback (most recent call last):\n  File "/x/conf.py", line 7\n    x = (\nAssertionError\n'
    raised = parse_traceback(text)
    assert raised is not None and (raised.exception, raised.location) == ("AssertionError", "conf.py:7")


def test_rank_prefixes_come_off_each_line() -> None:
    assert strip_rank_prefix("[rank12]: a\n[default3]:b\nc [rank1]: d") == "a\nb\nc [rank1]: d"


@pytest.mark.parametrize(("message", "cause"), [
    ("RuntimeError: ProcessGroupGloo::broadcast: invalid root rank: 2", Cause.USER_ERROR),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms "
     "for recv operation to complete", Cause.COMM),
    ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer", Cause.COMM),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
     Cause.COMM),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", Cause.CUDA_OOM),
])
def test_gloo_in_a_message_is_not_enough_for_a_communication_failure(message: str, cause: Cause,
                                                                     tmp_path: Path) -> None:
    folder = tmp_path / "a"
    stderr = folder / "ranks" / "x_1" / "attempt_0" / "0" / "stderr.log"
    stderr.parent.mkdir(parents=True)
    stderr.write_text(f'[rank0]: Traceback (most recent call last):\n[rank0]:   File "/x/t.py", line 1, in f\n'
                      f"[rank0]: {message}\n")
    failure = classify(folder, 1)
    assert (failure.cause, failure.rank) == (cause, 0)
    assert failure.exception == f"{message} (at t.py:1 in f)"


def test_fixtures_are_small_and_name_no_machine() -> None:
    files = [p for p in HERE.rglob("*") if p.is_file() and p.suffix in (".log", ".json")]
    assert files and sum(p.stat().st_size for p in files) < 100_000
    for path in files:
        text = path.read_text()
        assert "/work/" not in text and "/home/" not in text, path
        if path.name == "error.json":
            json.loads(text)
