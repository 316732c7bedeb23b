"""orchestrator/scripts/log_lines.py: the RUNYARD line protocol (strict, with torchrun's rank
prefix), the config's stdout regexes and their submit-time check, and the incremental tailer of
a growing log file (partial lines, truncation, replacement, a bounded read per call)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from orchestrator.scripts import Sample
from orchestrator.scripts.log_lines import (
    LineError,
    LineTailer,
    PatternError,
    Report,
    check_patterns,
    compile_patterns,
    parse_lines,
    parse_protocol,
)

# -- the protocol --------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    ('RUNYARD {"step": 10, "loss": 2.31}', Report(3, 10, {"loss": 2.31})),
    ('[rank1]: RUNYARD {"step": 0, "loss": 1, "lr": 3e-4}', Report(1, 0, {"loss": 1.0, "lr": 3e-4})),
    ('[default0]:RUNYARD {"step": 5, "acc": 0.5}', Report(0, 5, {"acc": 0.5})),
    ('[rank1]: RUNYARD {"step": 7, "rank": 4, "loss": 1.5}', Report(4, 7, {"loss": 1.5})),  # the line's own rank wins
    ('RUNYARD {"step": 20, "total": 300, "loss": 0.1}', Report(3, 20, {"loss": 0.1}, total=300)),
    ('RUNYARD {"step": 1}', Report(3, 1, {})),  # a heartbeat: progress without a metric
    ("12%|##   | 12/100\rRUNYARD {\"step\": 12, \"loss\": 0.5}", Report(3, 12, {"loss": 0.5})),  # after a \r
])
def test_protocol_lines(line: str, expected: Report) -> None:
    assert parse_protocol(line, default_rank=3) == expected


def test_nan_and_infinity_are_values() -> None:
    report = parse_protocol('RUNYARD {"step": 1, "loss": NaN, "grad": Infinity}', 0)
    assert report is not None and math.isnan(report.values["loss"]) and report.values["grad"] == math.inf


@pytest.mark.parametrize("line", [
    "iter 10: loss 2.31",
    "runyard {\"step\": 1}",  # the word is upper case
    "RUNYARD_STEP=3",
    " RUNYARD {\"step\": 1}",  # nothing before the word but torchrun's prefix
    "[rank0]: done",
])
def test_other_lines_are_not_the_protocol(line: str) -> None:
    assert parse_protocol(line, 0) is None


@pytest.mark.parametrize(("line", "problem"), [
    ("RUNYARD step=1 loss=2", "not a JSON object: 'step=1 loss=2'"),
    ("RUNYARD [1, 2]", "not a JSON object"),
    ('RUNYARD {"loss": 1.0}', 'no "step"'),
    ('RUNYARD {"step": -1, "loss": 1.0}', '"step" must be an integer >= 0, not -1'),
    ('RUNYARD {"step": 1.5, "loss": 1.0}', '"step" must be an integer >= 0, not 1.5'),
    ('RUNYARD {"step": "3", "loss": 1.0}', '"step" must be an integer >= 0, not "3"'),
    ('RUNYARD {"step": true}', '"step" must be an integer >= 0, not true'),
    ('RUNYARD {"step": 1, "loss": "0.5"}', '"loss" must be a number, not "0.5"'),
    ('RUNYARD {"step": 1, "ok": false}', '"ok" must be a number, not false'),
    ('RUNYARD {"step": 1, "m": {"a": 1}}', '"m" must be a number, not {"a": 1}'),
    ('RUNYARD {"step": 1, "total": 0}', '"total" must be an integer >= 1, not 0'),
    ('RUNYARD {"step": 1, "rank": -2}', '"rank" must be an integer >= 0, not -2'),
    ('RUNYARD {"step": 1, " ": 2}', '" " is not a metric name'),
])
def test_a_broken_protocol_line_names_the_key_and_the_value(line: str, problem: str) -> None:
    with pytest.raises(LineError) as err:
        parse_protocol(line, 0)
    assert problem in str(err.value)


def test_parse_lines_keeps_going_past_a_bad_line_and_counts_it() -> None:
    lines = ['RUNYARD {"step": 1, "loss": 2.0}', 'RUNYARD {"step": "x"}', 'RUNYARD {"step": "x"}',
             'RUNYARD {"step": 2, "loss": 1.0, "total": 50}', "noise"]
    parsed = parse_lines(lines, default_rank=1, wall_time=100.0)
    assert parsed.samples == [Sample(1, 1, "loss", 2.0, 100.0), Sample(1, 2, "loss", 1.0, 100.0)]
    assert parsed.total == 50 and parsed.newest_step == {"protocol": 2}
    assert parsed.skipped == 2 and len(parsed.problems) == 1  # the same problem once


# -- regexes -------------------------------------------------------------------------------------

LOSS = r"iter (?P<step>\d+): loss (?P<value>[\d.]+)"


def test_patterns_find_metrics_in_printed_lines() -> None:
    patterns = compile_patterns({"loss": LOSS, "lr": r"lr=(?P<value>\S+) at (?P<step>\d+)"})
    lines = ["iter 10: loss 2.3100, time 12.1ms", "[rank1]: iter 20: loss 2.0", "lr=3e-4 at 20", "nothing"]
    parsed = parse_lines(lines, default_rank=0, wall_time=5.0, patterns=patterns)
    assert parsed.samples == [Sample(0, 10, "loss", 2.31, 5.0), Sample(1, 20, "loss", 2.0, 5.0),
                              Sample(0, 20, "lr", 3e-4, 5.0)]
    assert parsed.newest_step == {"stdout_metrics": 20}


def test_a_pattern_match_that_is_not_a_number_is_a_problem() -> None:
    patterns = compile_patterns({"loss": r"iter (?P<step>\w+): loss (?P<value>\S+)"})
    parsed = parse_lines(["iter ten: loss 2.0", "iter 3: loss high"], 0, 1.0, patterns)
    assert parsed.samples == [] and parsed.skipped == 2
    assert "workload.stdout_metrics.loss matched 'iter ten: loss 2.0' but step 'ten'" in parsed.problems[0]


def test_protocol_lines_are_not_matched_by_patterns() -> None:
    patterns = compile_patterns({"x_again": r'"step": (?P<step>\d+), "x": (?P<value>\d)'})
    parsed = parse_lines(['RUNYARD {"step": 4, "x": 1}'], 0, 1.0, patterns)
    assert parsed.samples == [Sample(0, 4, "x", 1.0, 1.0)]  # once, from the protocol


@pytest.mark.parametrize(("patterns", "problem"), [
    ({"loss": r"iter (\d+): loss ([\d.]+)"},
     r"workload.stdout_metrics.loss = 'iter (\d+): loss ([\d.]+)' has no named group (?P<step>...) and (?P<value>...)"),
    ({"loss": r"iter (?P<step>\d+): loss"}, r"workload.stdout_metrics.loss = 'iter (?P<step>\d+): loss' has no "
                                            "named group (?P<value>...)"),
    ({"loss": r"iter (?P<step>\d+: loss (?P<value>\S+)"}, "is not a regular expression: missing ), unterminated "
                                                          "subpattern"),
    ({"loss": r"(?P<step>\d*)(?P<value>\d*)"}, "matches an empty line, so it would match every line"),
    ({"loss": 3}, "workload.stdout_metrics.loss must be a string (a regular expression), not 3"),
    ({"step": LOSS}, "workload.stdout_metrics: 'step' is not a metric name"),
    ({"": LOSS}, "workload.stdout_metrics: '' is not a metric name"),
])
def test_check_patterns_names_the_key_and_the_problem(patterns: dict, problem: str) -> None:
    problems = check_patterns(patterns)
    assert len(problems) == 1 and problem in problems[0], problems


def test_every_problem_is_reported_together() -> None:
    problems = check_patterns({"a": "(", "b": LOSS, "c": "x"})
    assert [p.split(" ")[0] for p in problems] == ["workload.stdout_metrics.a", "workload.stdout_metrics.c"]
    with pytest.raises(PatternError) as err:
        compile_patterns({"a": "(", "b": LOSS, "c": "x"})
    assert str(err.value).count("\n") == 1
    assert check_patterns({"loss": LOSS}) == []


# -- the tailer ----------------------------------------------------------------------------------


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_tailer_returns_new_complete_lines_and_keeps_a_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    tailer = LineTailer(path)
    assert tailer.read() == []  # not there yet
    append(path, "one\ntw")
    assert tailer.read() == ["one"]
    append(path, "o\r\nthree\n")
    assert tailer.read() == ["two", "three"]
    assert tailer.read() == []
    append(path, "unfinished")
    assert tailer.read() == [] and tailer.read(final=True) == ["unfinished"]
    assert tailer.grew_at == os.stat(path).st_mtime


def test_tailer_starts_over_after_truncation_and_replacement(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_text("a\nb\nc\n")
    tailer = LineTailer(path)
    assert tailer.read() == ["a", "b", "c"]
    path.write_text("x\n")  # truncated and rewritten, shorter than before
    assert tailer.read() == ["x"] and tailer.restarts == 1
    replacement = tmp_path / "new.log"
    replacement.write_text("first of the new file\nsecond\n")
    os.replace(replacement, path)  # rotated: a new file under the old name, longer than the offset
    assert tailer.read() == ["first of the new file", "second"] and tailer.restarts == 2


def test_tailer_reads_a_bounded_amount_per_call(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_text("".join(f"line {i:04d}\n" for i in range(1000)))  # 10 bytes a line
    tailer = LineTailer(path, max_bytes=1000)
    got: list[str] = []
    calls = 0
    while True:
        lines = tailer.read()
        calls += 1
        got += lines
        if not tailer.behind:
            break
        assert len(lines) <= 100
    assert got == [f"line {i:04d}" for i in range(1000)] and calls == 10


def test_tailer_cuts_an_overlong_line_and_drops_its_rest(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    tailer = LineTailer(path, max_bytes=100, max_line=30)
    append(path, "x" * 250)  # longer than max_line, no newline yet, over three reads
    lines = tailer.read() + tailer.read() + tailer.read()
    append(path, "yyy\nnext\n")
    lines += tailer.read()
    assert lines == ["x" * 30, "next"]


def test_undecodable_bytes_do_not_stop_the_tailer(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(b"\xff\xfe bad\nRUNYARD {\"step\": 1, \"loss\": 0.5}\n")
    lines = LineTailer(path).read()
    assert lines[1] == 'RUNYARD {"step": 1, "loss": 0.5}' and "bad" in lines[0]


@pytest.mark.parametrize(("line", "saved"), [
    ("Saving model checkpoint to hf_out/checkpoint-350", True),  # Hugging Face Trainer (log level info)
    ("saving checkpoint to out", True),  # nanoGPT
    ("Epoch 5 | Training snapshot saved at snapshot.pt", True),  # the DDP tutorial
    ("Epoch 3, global step 300: 'val_loss' reached 0.25 (best 0.25), saving model to 'ckpts/x.ckpt'", True),
    ("iter 40: loss 2.31, time 10.2ms", False),
    ("[GPU0] Epoch 3 | Batchsize: 32 | Steps: 8", False),
    ("the model is saved nowhere", False),
])
def test_lines_that_say_a_checkpoint_was_saved(line: str, saved: bool) -> None:
    assert (parse_lines([line], 0, 0.0).saved == line) is saved
