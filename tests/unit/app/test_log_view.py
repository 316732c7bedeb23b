"""The Run page's logs as text (app/log_view.py): search, first error, line numbers, escaping and
the zip of every log; the page itself is in tests/unit/app/views/test_run.py."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from app.log_view import (
    _view,
    first_error,
    fold_frames,
    fold_text,
    line_levels,
    log_html,
    log_sources,
    logs_zip,
    matching,
    one_log_text,
    read_log,
)

LOG = """step 1 loss 2.30
step 2 loss 2.10
[rank1]: Traceback (most recent call last):
[rank1]:   File "train.py", line 3, in <module>
[rank1]: ValueError: <img src=x> **loud** $x$
"""


def rank_logs(attempt: Path, ranks: int = 2) -> dict[int, Path]:
    """torchrun's layout: ranks/<rdzv>_<random>/attempt_0/<local rank>/std{out,err}.log."""
    out = {}
    for rank in range(ranks):
        folder = attempt / "ranks" / "abc_1" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stdout.log").write_text(f"rank {rank} says hello\n")
        (folder / "stderr.log").write_text(LOG if rank == 1 else "")
        out[rank] = folder
    (attempt / "launcher.log").write_text("torchrun started\n")
    return out


def test_search_finds_every_line_in_any_case_and_marks_each_match_escaped() -> None:
    lines = LOG.splitlines()
    assert matching(lines, "LOSS") == [0, 1]
    assert matching(lines, "") == []
    page = log_html([(5, lines[4])], query="loud")
    assert "<mark>loud</mark>" in page
    assert "&lt;img src=x&gt;" in page and "<img" not in page  # the log's markup is text
    assert '<span class="runyard-log-no">5</span>' in page


def test_the_first_error_is_the_traceback_not_an_earlier_line() -> None:
    assert first_error(LOG.splitlines()) == 2
    assert first_error(["all fine", "step 3"]) is None
    assert first_error(["torch.OutOfMemoryError: CUDA out of memory"]) == 0


def test_a_long_log_is_read_from_its_end_with_the_files_line_numbers(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 1001)))
    text = read_log(log, max_bytes=100)
    assert text.cut and text.lines[-1] == "line 1000"
    assert text.numbered()[0] == (text.first_line, text.lines[0])
    assert text.lines[0] == f"line {text.first_line}"  # numbered as in the file, the partial line left out
    whole = read_log(log)
    assert not whole.cut and whole.first_line == 1 and len(whole.lines) == 1000
    assert read_log(tmp_path / "missing.log").lines == []


def test_every_rank_and_the_launcher_go_into_the_zip_and_one_rank_into_one_file(tmp_path: Path) -> None:
    attempt = tmp_path / "attempts" / "1"
    rank_logs(attempt)
    sources = log_sources(attempt)
    assert list(sources) == ["rank 0", "rank 1", "launcher"]
    one = one_log_text(sources["rank 1"])
    assert "==> stderr.log <==" in one and "ValueError: <img src=x>" in one and "==> stdout.log <==" in one
    names = zipfile.ZipFile(io.BytesIO(logs_zip([(1, attempt)]))).namelist()
    assert sorted(names) == ["attempt-1/launcher.log", "attempt-1/rank-0/stderr.log", "attempt-1/rank-0/stdout.log",
                             "attempt-1/rank-1/stderr.log", "attempt-1/rank-1/stdout.log"]


def traceback_of(root: Path, prefix: str = "") -> list[str]:
    """A user script's failure as runyard's script runner raises it: runyard's frames (the trainer's
    entry, runpy between them) before the user's, Python 3.11's ``^^^`` marks under some."""
    lines = [
        "Traceback (most recent call last):",
        f'  File "{root}/trainer/process_exit.py", line 40, in run_and_exit',
        "    code = main()",
        "           ^^^^^^",
        f'  File "{root}/trainer/script_runner.py", line 88, in main',
        "    runpy.run_path(script, run_name='__main__')",
        '  File "<frozen runpy>", line 291, in run_path',
        '  File "/home/me/proj/train.py", line 12, in <module>',
        "    train(model)",
        '  File "/home/me/proj/train.py", line 7, in train',
        "    raise ValueError('lr too high')",
        "ValueError: lr too high",
    ]
    return [prefix + line for line in lines]


def test_a_traceback_starts_at_the_users_code_with_runyards_frames_folded(tmp_path: Path) -> None:
    roots = (f"{tmp_path}/trainer/", f"{tmp_path}/orchestrator/")
    for prefix in ("", "[rank1]: "):
        lines = ["step 3 loss 2.0", *traceback_of(tmp_path, prefix)]
        shown = fold_frames(list(enumerate(lines, start=1)), roots)
        texts = [line for _, line in shown]
        assert texts[:3] == ["step 3 loss 2.0", f"{prefix}Traceback (most recent call last):",
                             f"{prefix}  … 3 runyard frames (trainer/process_exit.py, trainer/script_runner.py)"]
        assert texts[3] == f'{prefix}  File "/home/me/proj/train.py", line 12, in <module>'  # the user's code next
        assert texts[-1] == f"{prefix}ValueError: lr too high"
        assert shown[2][0] is None and shown[3][0] == 9  # the fold has no line number; the rest keep theirs
        assert len(shown) == len(lines) - 5
    # A log without runyard's frames (or runpy's alone) is left as it is.
    plain = ['  File "<frozen runpy>", line 291, in run_path', '  File "/home/me/x.py", line 1, in <module>', "    x()"]
    assert fold_frames(list(enumerate(plain)), roots) == list(enumerate(plain))
    assert fold_text("\n".join(traceback_of(tmp_path)), roots).count("runyard frames") == 1


def test_the_level_of_a_line_comes_from_its_text_a_whole_traceback_an_error() -> None:
    lines = ["step 1 loss 2.0", "WARNING: clipping gradients", "[rank0]: UserWarning: TypedStorage is deprecated",
             "[rank1]: Traceback (most recent call last):", '[rank1]:   File "train.py", line 3, in <module>',
             "[rank1]:     boom()", "[rank1]: RuntimeError: boom", "step 2 loss 1.9", "ERROR fetching shard 3",
             "NCCL WARN timeout soon"]
    assert line_levels(lines) == ["info", "warning", "warning", "error", "error", "error", "error", "info", "error",
                                  "warning"]


def test_the_level_filter_keeps_the_chosen_levels_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_text("step 1\nWARNING: slow\n" + "\n".join(traceback_of(tmp_path)) + "\nstep 2\n")
    text = read_log(log)
    shown, _, caption = _view(text, "", at_error=False, levels=("error",))
    texts = [line for _, line in shown]
    assert texts[0] == "Traceback (most recent call last):" and texts[-1] == "ValueError: lr too high"
    assert not any("step" in line or "WARNING" in line for _, line in shown)
    assert caption.endswith("error lines only")
    every, _, caption = _view(text, "", at_error=False)
    assert [line for _, line in every][:2] == ["step 1", "WARNING: slow"] and "only" not in caption
    # The levels first, then the end: an error 400 lines back is still in the error lines' end.
    log.write_text("ERROR shard 3 unreadable\n" + "".join(f"step {i}\n" for i in range(400)))
    shown, _, _ = _view(read_log(log), "", at_error=False, levels=("error",))
    assert shown == [(1, "ERROR shard 3 unreadable")]
