"""An unchanged script's metrics, end to end: tests/scripts/plain_metrics.py runs under real
2-rank torchrun (launched directly, with the per-rank log layout the scheduler uses), an
AttemptCollector reads its folders while it trains and after, write() puts the points into a
real SQLite metric store, and they come back per rank and per tag, each on its own steps."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from db.engine import make_engine, upgrade
from db.metricstore import metric_keys, series
from db.models import Attempt, Run
from db.vocabulary.layout import RANK_LOG_DIR
from orchestrator.executors.launcher import free_port
from orchestrator.scripts.metric_collector import AttemptCollector, write

pytestmark = pytest.mark.slow
pytest.importorskip("tensorboard")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "plain_metrics.py"
STEPS = 40
LOSS = r"iter (?P<step>\d+): loss (?P<value>[\d.]+)"


def torchrun(attempt_dir: Path, workdir: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--max-restarts=0",
            f"--log-dir={attempt_dir / RANK_LOG_DIR}", "--redirects=3", str(SCRIPT), "--steps", str(STEPS),
            "--sleep", "0.1"]
    log = open(attempt_dir / "launcher.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(argv, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def rank_pids(proc: subprocess.Popen) -> dict[int, int]:
    """{pid: rank} of torchrun's ranks, from their environment (what the scheduler can do too)."""
    found = {}
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return {}
    for child in children:
        try:
            rank = child.environ().get("RANK")
        except psutil.Error:
            continue
        if rank is not None:
            found[child.pid] = int(rank)
    return found


def new_attempt(session: Session) -> int:
    run = Run(name="plain", status="RUNNING", config_json="{}", config_hash="h", tags_json="[]", max_steps=0, nproc=2,
              run_dir="/x", price_usd_per_hour=0.0, price_unit="cpu", created_at=1.0, updated_at=1.0)
    session.add(run)
    session.flush()
    session.add(Attempt(run_id=run.id, number=1, status="RUNNING", dir="/x", started_at=time.time()))
    return run.id


def test_a_plain_scripts_metrics_reach_the_store_per_rank_and_tag(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runyard.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as s, s.begin():
        run_id = new_attempt(s)
    workdir, attempt_dir = tmp_path / "work", tmp_path / "attempts" / "1"
    workdir.mkdir()
    attempt_dir.mkdir(parents=True)
    started = time.time()
    proc = torchrun(attempt_dir, workdir)
    collector = AttemptCollector(run_id, 1, attempt_dir, workdir, stdout_metrics={"iter_loss": LOSS},
                                 since=started - 1, rescan_s=0.5)
    live_polls, totals, problems = 0, set(), []
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            pids = rank_pids(proc)
            if len(pids) == 2:
                collector.set_pid_ranks(pids)
            got = collector.collect()
            live_polls += bool(got.points)
            totals.add(got.total)
            problems += got.problems
            with Session(engine) as s, s.begin():
                write(s, run_id, 1, got.points)
            time.sleep(0.2)
        assert proc.wait(timeout=30) == 0, (attempt_dir / "launcher.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    while True:  # what the last moments wrote
        got = collector.collect(final=True)
        totals.add(got.total)
        problems += got.problems
        with Session(engine) as s, s.begin():
            write(s, run_id, 1, got.points)
        if not got.behind and not got.points:
            break
    assert live_polls >= 2, "the metrics should arrive while the script trains, not only at the end"
    assert problems == [] and STEPS in totals

    with Session(engine) as s:
        assert metric_keys(s, run_id) == ["eval/acc", "iter_loss", "lr", "mean_loss", "train/loss"]

        def per_rank(key: str) -> dict[int, list[tuple[int, float]]]:
            out: dict[int, list[tuple[int, float]]] = {}
            for row in series(s, run_id, key, level=0).rows:
                out.setdefault(row["rank"], []).append((row["step"], row["value"]))
            return out

        # The regex over each rank's stdout: every step, each rank its own loss.
        iter_loss = per_rank("iter_loss")
        assert sorted(iter_loss) == [0, 1]
        for rank, points in iter_loss.items():
            assert [step for step, _ in points] == list(range(1, STEPS + 1))
            assert all(value == pytest.approx(1 / step + rank / 100, abs=1e-4) for step, value in points)
        # TensorBoard: the rank from each writer's pid; each tag on its own counter.
        train = per_rank("train/loss")
        assert {rank: [step for step, _ in pts] for rank, pts in train.items()} == {
            0: list(range(1, STEPS + 1)), 1: list(range(1, STEPS + 1))}
        assert per_rank("eval/acc") == {
            rank: [(epoch, pytest.approx(0.5 + epoch / 10 + rank / 1000)) for epoch in range(1, STEPS // 10 + 1)]
            for rank in (0, 1)}
        # The RUNYARD lines: every 5 steps, on both ranks.
        lr = per_rank("lr")
        assert {rank: [step for step, _ in pts] for rank, pts in lr.items()} == {
            0: list(range(5, STEPS + 1, 5)), 1: list(range(5, STEPS + 1, 5))}
        attempt = s.scalars(select(Attempt).where(Attempt.run_id == run_id)).one()
        assert attempt.last_step == STEPS and attempt.first_step_at is not None
        assert attempt.progress_at is not None and started <= attempt.progress_at <= time.time()
    engine.dispose()
