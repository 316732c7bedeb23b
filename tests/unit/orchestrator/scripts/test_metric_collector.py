"""orchestrator/scripts/metric_collector.py: one attempt's points from the ranks' logs (protocol
lines, regexes) and TensorBoard files, only the new ones each call and a bounded amount, with the
activity a hang watchdog reads; write() stores them in a real SQLite metric store and moves the
attempt's progress forward, never back."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from db.engine import make_engine, upgrade
from db.metricstore import series
from db.models import Attempt, Run
from orchestrator.scripts.log_lines import PatternError
from orchestrator.scripts.metric_collector import AttemptCollector, write

LOSS = r"iter (?P<step>\d+): loss (?P<value>[\d.]+)"


def rank_dir(attempt_dir: Path, local_rank: int) -> Path:
    folder = attempt_dir / "ranks" / "runyard-1-1_abc123" / "attempt_0" / str(local_rank)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


@pytest.fixture
def attempt_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "run" / "attempts" / "1"
    for rank in (0, 1):
        for name in ("stdout.log", "stderr.log"):
            (rank_dir(folder, rank) / name).touch()
    return folder


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'runyard.db'}"
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def new_attempt(engine: Engine) -> int:
    with Session(engine) as s, s.begin():
        run = Run(name="plain", status="RUNNING", config_json="{}", config_hash="h", tags_json="[]", max_steps=0,
                  nproc=2, run_dir="/x", price_usd_per_hour=0.0, price_unit="cpu", created_at=1.0, updated_at=1.0)
        s.add(run)
        s.flush()
        s.add(Attempt(run_id=run.id, number=1, status="RUNNING", dir="/x", started_at=1.0))
        return run.id


def collector(attempt_dir: Path, workdir: Path, **kwargs: object) -> AttemptCollector:
    kwargs.setdefault("tensorboard_dirs", [])
    return AttemptCollector(7, 1, attempt_dir, workdir, rescan_s=0.0, **kwargs)  # type: ignore[arg-type]


def test_protocol_and_regex_lines_of_every_rank(attempt_dir: Path, tmp_path: Path) -> None:
    append(rank_dir(attempt_dir, 0) / "stdout.log",
           'RUNYARD {"step": 1, "loss": 2.5, "total": 300}\niter 1: loss 2.4000\nRUNYARD {"step": 2, "loss": 2.0}\n')
    append(rank_dir(attempt_dir, 1) / "stderr.log", '[rank1]: RUNYARD {"step": 1, "loss": 2.6}\n[rank1]: warning\n')
    c = collector(attempt_dir, tmp_path, stdout_metrics={"iter_loss": LOSS})
    got = c.collect()
    assert sorted((p["rank"], p["key"], p["step"], p["value"]) for p in got.points) == [
        (0, "iter_loss", 1, 2.4), (0, "loss", 1, 2.5), (0, "loss", 2, 2.0), (1, "loss", 1, 2.6)]
    assert all(p["run_id"] == 7 and p["attempt"] == 1 for p in got.points)
    assert got.total == 300 and got.problems == [] and not got.behind
    assert got.activity.newest_step == {"protocol": 2, "stdout_metrics": 1}
    stdout = rank_dir(attempt_dir, 0) / "stdout.log"
    stderr = rank_dir(attempt_dir, 1) / "stderr.log"
    assert got.activity.output_at == max(os.stat(stdout).st_mtime, os.stat(stderr).st_mtime)
    assert all(p["wall_time"] <= time.time() for p in got.points)


def test_each_call_returns_only_what_is_new(attempt_dir: Path, tmp_path: Path) -> None:
    stdout = rank_dir(attempt_dir, 0) / "stdout.log"
    c = collector(attempt_dir, tmp_path)
    assert c.collect().points == []
    append(stdout, 'RUNYARD {"step": 1, "loss": 1.0}\nRUNYARD {"step": 2, "lo')  # the second line is half written
    assert [p["step"] for p in c.collect().points] == [1]
    append(stdout, 'ss": 0.5}\n')
    assert [(p["step"], p["value"]) for p in c.collect().points] == [(2, 0.5)]
    assert c.collect().points == []
    append(stdout, 'RUNYARD {"step": 3, "loss": 0.25}')  # no newline: the script ended
    assert c.collect().points == []
    assert [p["step"] for p in c.collect(final=True).points] == [3]


def test_a_problem_is_reported_once_naming_the_file_and_rank(attempt_dir: Path, tmp_path: Path) -> None:
    stdout = rank_dir(attempt_dir, 1) / "stdout.log"
    c = collector(attempt_dir, tmp_path)
    append(stdout, 'RUNYARD {"step": 1, "loss": "low"}\n')
    assert c.collect().problems == ['stdout.log of rank 1: RUNYARD line: "loss" must be a number, not "low"']
    append(stdout, 'RUNYARD {"step": 2, "loss": "low"}\n')
    assert c.collect().problems == []  # the same problem again: not news


def test_reads_are_bounded_and_catch_up(attempt_dir: Path, tmp_path: Path) -> None:
    stdout = rank_dir(attempt_dir, 0) / "stdout.log"
    append(stdout, "".join(f'RUNYARD {{"step": {i}, "loss": 1.0}}\n' for i in range(2000)))  # ~66 KB
    c = collector(attempt_dir, tmp_path, max_bytes=16 * 1024)
    steps: list[int] = []
    calls = 0
    while True:
        got = c.collect()
        calls += 1
        steps += [p["step"] for p in got.points]
        if not got.behind:
            break
    assert steps == list(range(2000)) and calls >= 4


def test_tensorboard_files_in_the_workdir(attempt_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - after importorskip: tensorboard is the [scripts] extra

    workdir = tmp_path / "work"
    c = collector(attempt_dir, workdir, tensorboard_dirs=None, pid_ranks={os.getpid(): 1})
    assert c.collect().points == []  # runs/ does not exist yet
    writer = SummaryWriter(str(workdir / "runs" / "exp"))
    writer.add_scalar("train/loss", 2.0, 10)
    writer.add_scalar("eval/acc", 0.5, 1)
    writer.flush()
    got = c.collect()
    assert sorted((p["rank"], p["key"], p["step"]) for p in got.points) == [(1, "eval/acc", 1), (1, "train/loss", 10)]
    assert got.activity.newest_step == {"tensorboard": 10} and got.activity.events_at is not None
    writer.close()


def test_bad_patterns_are_refused_up_front(attempt_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(PatternError, match=r"workload.stdout_metrics.loss = 'iter \(\\d\+\)' has no named group"):
        collector(attempt_dir, tmp_path, stdout_metrics={"loss": r"iter (\d+)"})


def test_write_stores_points_per_rank_and_moves_progress_forward(attempt_dir: Path, tmp_path: Path,
                                                                 engine: Engine) -> None:
    run_id = new_attempt(engine)
    stdout0, stderr1 = rank_dir(attempt_dir, 0) / "stdout.log", rank_dir(attempt_dir, 1) / "stderr.log"
    append(stdout0, 'RUNYARD {"step": 10, "loss": 2.0}\nRUNYARD {"step": 20, "loss": 1.0}\n')
    append(stderr1, '[rank1]: RUNYARD {"step": 10, "loss": 2.5}\n')
    c = AttemptCollector(run_id, 1, attempt_dir, tmp_path, tensorboard_dirs=[], rescan_s=0.0)
    got = c.collect()
    with Session(engine) as s, s.begin():
        write(s, run_id, 1, got.points)
    with Session(engine) as s:
        rows = series(s, run_id, "loss").rows
        assert sorted((r["rank"], r["step"], r["value"]) for r in rows) == [(0, 10, 2.0), (0, 20, 1.0), (1, 10, 2.5)]
        attempt = s.scalars(select(Attempt).where(Attempt.run_id == run_id)).one()
        assert attempt.last_step == 20
        first_at, progress_at = attempt.first_step_at, attempt.progress_at
        assert first_at is not None and progress_at is not None
        assert progress_at == max(p["wall_time"] for p in got.points)
    # The same points read again (a restarted scheduler) and an older one change nothing.
    with engine.begin() as conn:
        write(conn, run_id, 1, [*got.points, {**got.points[0], "step": 5, "wall_time": 1.0}])
    with engine.begin() as conn:
        write(conn, run_id, 1, [], at=progress_at + 30)  # activity alone moves progress_at
    with Session(engine) as s:
        attempt = s.scalars(select(Attempt).where(Attempt.run_id == run_id)).one()
        assert (attempt.last_step, attempt.first_step_at, attempt.progress_at) == (20, first_at, progress_at + 30)
        assert len(series(s, run_id, "loss").rows) == 4  # step 5 was new; nothing doubled


def test_without_tensorboard_installed_the_logs_are_still_read(attempt_dir: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "orchestrator.scripts.tensorboard_events", None)  # import fails
    append(rank_dir(attempt_dir, 0) / "stdout.log", 'RUNYARD {"step": 1, "loss": 1.0}\n')
    c = collector(attempt_dir, tmp_path, tensorboard_dirs=None)
    got = c.collect()
    assert [p["key"] for p in got.points] == ["loss"]
    assert len(got.problems) == 1 and "pip install 'runyard[scripts]'" in got.problems[0]
    assert c.collect().problems == []  # said once


def test_the_final_read_finds_event_files_written_in_the_last_second(attempt_dir: Path, tmp_path: Path) -> None:
    """A 2-second script: the collector's first look finds no runs/ folder; the ranks then write
    their scalars into new folders, close and exit, all before the next search for event files is
    due (every 5 s). The final read after the exit must search again and read them to the end."""
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - after importorskip: tensorboard is the [scripts] extra

    now = [100.0]
    workdir = tmp_path / "work"
    c = AttemptCollector(1, 1, attempt_dir, workdir, tensorboard_dirs=None, clock=lambda: now[0])
    assert c.collect().points == []  # the ranks are starting: nothing yet
    for rank in (0, 1):
        writer = SummaryWriter(str(workdir / "runs" / f"rank{rank}"))
        for step in range(0, 30, 10):
            writer.add_scalar("train/loss", 1.0 / (step + 1), step)
        writer.close()
    now[0] += 1.5  # the attempt ended 1.5 s after the first look
    steps = sorted(p["step"] for p in c.collect(final=True).points)
    assert steps == [0, 0, 10, 10, 20, 20]


def test_log_folders_are_searched_every_call_until_every_rank_has_its_files(tmp_path: Path) -> None:
    """The ranks' log files appear a few seconds after the launch (torchrun starts them): their
    first lines are read on the next call, not up to rescan_s later; once every rank's files are
    there, the folders are searched only every rescan_s."""
    attempt_dir = tmp_path / "run" / "attempts" / "1"
    now = [100.0]
    c = AttemptCollector(7, 1, attempt_dir, tmp_path, tensorboard_dirs=[], rescan_s=5.0, ranks=2,
                         clock=lambda: now[0])
    assert c.collect().points == []  # at launch: no rank has started yet
    now[0] += 0.5
    append(rank_dir(attempt_dir, 0) / "stdout.log", 'RUNYARD {"step": 1, "loss": 1.0}\n')
    assert [(p["rank"], p["step"]) for p in c.collect().points] == [(0, 1)]
    now[0] += 0.5
    append(rank_dir(attempt_dir, 1) / "stdout.log", 'RUNYARD {"step": 1, "loss": 1.5}\n')
    assert [(p["rank"], p["step"]) for p in c.collect().points] == [(1, 1)]
    now[0] += 0.5
    append(rank_dir(attempt_dir, 1) / "stderr.log", 'RUNYARD {"step": 2, "loss": 1.25}\n')
    assert c.collect().points == []  # every rank found: a new file waits for the next search
    now[0] += 5.0
    assert [(p["rank"], p["step"]) for p in c.collect().points] == [(1, 2)]
