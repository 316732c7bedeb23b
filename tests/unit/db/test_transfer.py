"""`runyard db export` / `import` (db/transfer.py) across dialects: every value comes back exactly
(infinities, NULL-as-NaN, booleans, long float times, Unicode, ids and the references between
them, including the runs <-> checkpoints cycle), an import is all or nothing, and it refuses a
database that is not empty or at another schema revision."""

from __future__ import annotations

import gzip
import json
import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, select

from db.engine import current_revision, make_engine, make_sessionmaker, upgrade
from db.models import (
    Alert,
    AlertDelivery,
    Attempt,
    AttemptEnergy,
    Checkpoint,
    Event,
    MetricName,
    MetricPoint,
    MetricRollup,
    PriceEntry,
    Run,
    RunStatusHistory,
    SchedulerHeartbeat,
    Sweep,
    SweepStatusHistory,
    SweepTrial,
    SystemMetric,
)
from db.transfer import TransferError, export, import_, nonempty_tables
from orchestrator.cli.group import cli

NOW = time.time()


def sqlite_url(tmp_path: Path, name: str) -> str:
    return f"sqlite:///{tmp_path / name / 'runyard.db'}"


def engine_at(url: str) -> Engine:
    upgrade(url)
    return make_engine(url)


def fill(engine: Engine) -> None:
    """A small data set touching every table and every kind of value."""
    with make_sessionmaker(engine)() as s:
        config = json.dumps({"name": "ünï 🚀", "train": {"lr": 1e-3}})
        parent = Run(name="ünï 🚀", status="SUCCEEDED", config_json=config, config_hash="a" * 64, max_steps=100,
                     nproc=2, run_dir="/data/runs/run-000001", price_usd_per_hour=2.5, price_unit="cpu-node",
                     created_at=NOW - 0.123456789, updated_at=NOW, started_at=NOW - 100.000001, ended_at=NOW,
                     start_fresh=True)
        s.add(parent)
        s.flush()
        s.add(Attempt(run_id=parent.id, number=1, status="FAILED", dir="/data/a/1", started_at=NOW - 99.5,
                      exit_code=-9, cause="SIGNAL", failed_rank=1, exception="killed\nby SIGKILL",
                      retry_counted=False, devices_json="[0, 1]", overrides_json='{"x": 1}', scheduler_id=7))
        s.add(Attempt(run_id=parent.id, number=2, status="SUCCEEDED", dir="/data/a/2", started_at=NOW - 50,
                      ended_at=NOW, retry_counted=True))
        ckpt = Checkpoint(run_id=parent.id, attempt=2, step=50, path="/data/c/50/manifest.json", bytes=2**40,
                          sha256="b" * 64, params_digest="c" * 64, blocked_s=0.25, total_s=1.5, created_at=NOW - 10,
                          verified=False, pinned=True, deleted=False, refused_reason="bad\tbytes")
        s.add(ckpt)
        s.flush()
        attempt_one = s.scalars(select(Attempt.id).where(Attempt.run_id == parent.id, Attempt.number == 1)).one()
        s.add(AttemptEnergy(attempt_id=attempt_one, device="gpu1", method="measured", joules=0.1 + 0.2,
                            counter=2.0**53, read_at=NOW, uncovered_s=0.0, note=""))
        parent.resume_checkpoint_id = ckpt.id  # runs -> checkpoints -> runs: a cycle
        fork = Run(name="fork", status="QUEUED", config_json=config, config_hash="d" * 64, max_steps=10, nproc=1,
                   created_at=NOW, updated_at=NOW, parent_run_id=parent.id, parent_step=50,
                   parent_checkpoint_id=ckpt.id)
        s.add(fork)
        name = MetricName(name="loss")
        s.add(name)
        s.flush()
        for step, value in enumerate([math.inf, -math.inf, None, 0.1 + 0.2, 5e-324, 1.7976931348623157e308]):
            s.add(MetricPoint(run_id=parent.id, name_id=name.id, attempt=2, step=step, rank=0, value=value,
                              wall_time=NOW + step / 3))
        s.add(MetricRollup(run_id=parent.id, name_id=name.id, level=1, attempt=2, bucket=0, rank=0, min_value=None,
                           max_value=math.inf, sum_value=None, count=6, nan_count=1, first_step=0, last_step=5,
                           first_time=NOW, last_time=NOW + 5 / 3, last_value=1.7976931348623157e308))
        s.add(RunStatusHistory(run_id=parent.id, from_status=None, to_status="QUEUED", reason="submitted", at=NOW))
        s.add(Event(run_id=parent.id, attempt=1, at=NOW, level="warning", kind="exit", message="rank 1: SIGKILL"))
        s.add(SchedulerHeartbeat(host="node-a", pid=4242, started_at=NOW - 3600, beat_at=NOW, home="/data"))
        s.add(PriceEntry(device="H100", usd_per_hour=3.99, updated_at=NOW))
        sweep = Sweep(name="lr", status="STOPPED", status_reason="the breaker tripped", base_json=config,
                      sweep_json='{"metric": "eval_loss"}', seed=2**32 - 1, max_trials=9, max_concurrent=2,
                      rungs_json="[20, 60]", created_at=NOW, updated_at=NOW, ended_at=NOW)
        s.add(sweep)
        s.flush()
        s.add(SweepStatusHistory(sweep_id=sweep.id, from_status="RUNNING", to_status="STOPPED", reason="breaker",
                                 at=NOW))
        s.add(SweepTrial(sweep_id=sweep.id, number=0, run_id=parent.id, params_json='{"train.lr": 0.001}',
                         history_json="[]", rung=1, rungs_json='{"0": [20, 0.5], "1": [60, NaN]}', objective=0.25,
                         objective_step=100, prune_json=None, promoted=1, created_at=NOW))
        s.add(SystemMetric(at=NOW, host="node-a", device="gpu0", run_id=parent.id, rank=0, key="util_percent",
                           min=0.0, mean=50.5, max=100.0, count=5))
        alert = Alert(key=f"run:{parent.id}:failed:1", run_id=parent.id, trigger="failed", state="open",
                      message="run 1 failed: SIGNAL", opened_at=NOW, sent_at=NOW, repeats=0)
        s.add(alert)
        s.flush()
        for kind in ("fire", "repeat", "resolved"):
            s.add(AlertDelivery(alert_id=alert.id, run_id=parent.id, channel_id=1, channel="json://h/***", kind=kind,
                                trigger="failed", message="ünï failed", status="failed", tries=4, error="HTTP 500",
                                created_at=NOW, next_at=NOW + 0.5, done_at=NOW + 1))
        s.commit()


def dump(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as src:
        return src.read().splitlines()


@pytest.mark.parametrize("source", ["sqlite", "postgres"])
def test_a_data_set_moves_to_the_other_dialect_and_back_unchanged(
        source: str, tmp_path: Path, pg_url: str) -> None:
    first_url, second_url = (sqlite_url(tmp_path, "a"), pg_url)
    if source == "postgres":
        first_url, second_url = pg_url, sqlite_url(tmp_path, "b")
    first, second = engine_at(first_url), engine_at(second_url)
    fill(first)
    exported, again = tmp_path / "first.jsonl.gz", tmp_path / "second.jsonl.gz"
    schema = current_revision(first)
    summary = export(first, exported, schema)
    assert summary.rows["metric_points"] == 6 and summary.rows["runs"] == 2
    import_(second, exported, current_revision(second))
    export(second, again, current_revision(second))
    assert dump(again) == dump(exported)  # every value of every row, in the same order
    with make_sessionmaker(second)() as s:
        values = s.scalars(select(MetricPoint.value).order_by(MetricPoint.step)).all()
        ckpt = s.scalars(select(Checkpoint)).one()
        fork = s.scalars(select(Run).where(Run.name == "fork")).one()
        parent = s.get_one(Run, fork.parent_run_id)
        assert parent is not None
        assert values == [math.inf, -math.inf, None, 0.1 + 0.2, 5e-324, 1.7976931348623157e308]
        assert (ckpt.verified, ckpt.pinned, ckpt.bytes) == (False, True, 2**40)
        assert fork.parent_checkpoint_id == ckpt.id == parent.resume_checkpoint_id
        assert parent.name == "ünï 🚀" and parent.created_at == NOW - 0.123456789 and parent.start_fresh is True
        # New rows take ids after the imported ones (PostgreSQL: the sequences were moved on).
        s.add(Run(name="new", status="QUEUED", config_json="{}", config_hash="e" * 64, max_steps=1, nproc=1,
                  created_at=NOW, updated_at=NOW))
        s.add(Event(run_id=parent.id, at=NOW, kind="x", message="new"))
        s.commit()
        assert s.scalar(select(func.max(Run.id))) == 3
        assert s.scalar(select(func.count()).select_from(Event)) == 2
    for engine in (first, second):
        engine.dispose()


def test_a_database_with_rows_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    source, target = engine_at(sqlite_url(tmp_path, "a")), engine_at(sqlite_url(tmp_path, "b"))
    fill(source)
    export(source, tmp_path / "x.jsonl.gz", current_revision(source))
    with make_sessionmaker(target)() as s:
        s.add(PriceEntry(device="cpu-node", usd_per_hour=1.0, updated_at=NOW))
        s.commit()
    with pytest.raises(TransferError) as refused:
        import_(target, tmp_path / "x.jsonl.gz", current_revision(target))
    assert "is not empty: prices (1 rows)" in str(refused.value)
    assert "point RUNYARD_DB_URL at a new one" in str(refused.value)
    with target.connect() as conn:
        assert nonempty_tables(conn) == {"prices": 1}


def test_a_truncated_file_imports_nothing(tmp_path: Path) -> None:
    source, target = engine_at(sqlite_url(tmp_path, "a")), engine_at(sqlite_url(tmp_path, "b"))
    fill(source)
    whole, cut = tmp_path / "whole.jsonl.gz", tmp_path / "cut.jsonl.gz"
    export(source, whole, current_revision(source))
    lines = dump(whole)
    with gzip.open(cut, "wt", encoding="utf-8") as out:
        out.write("\n".join(lines[:-3]) + "\n")  # the last table loses rows
    with pytest.raises(TransferError, match="the file ends after"):
        import_(target, cut, current_revision(target))
    with target.connect() as conn:
        assert nonempty_tables(conn) == {}  # runs, attempts... of the earlier tables were rolled back


def test_another_schema_revision_and_a_file_that_is_not_an_export_are_refused(tmp_path: Path) -> None:
    source, target = engine_at(sqlite_url(tmp_path, "a")), engine_at(sqlite_url(tmp_path, "b"))
    fill(source)
    path = tmp_path / "x.jsonl.gz"
    export(source, path, current_revision(source))
    lines = dump(path)
    header = json.loads(lines[0])
    header["schema"] = "0001"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    head = current_revision(target)  # the newest revision, whichever that is
    with pytest.raises(TransferError, match=rf"exported at schema revision '0001', this database is at '{head}'"):
        import_(target, path, current_revision(target))
    plain = tmp_path / "notes.txt"
    plain.write_text("hello\n")
    with pytest.raises(TransferError, match="is not a runyard export"):
        import_(target, plain, current_revision(target))


def test_the_cli_exports_and_imports_with_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source_url, target_url = sqlite_url(tmp_path, "a"), sqlite_url(tmp_path, "b")
    fill(engine_at(source_url))
    path = tmp_path / "x.jsonl.gz"
    monkeypatch.setenv("RUNYARD_HOME", str(tmp_path / "a"))
    monkeypatch.setenv("RUNYARD_DB_URL", source_url)
    result = CliRunner().invoke(cli, ["db", "export", str(path)])
    assert result.exit_code == 0, result.output
    assert "exported metric_points: 6 of 6 rows (100%)" in result.output
    assert f"exported 26 rows of 18 tables from {source_url} to {path}" in result.output
    monkeypatch.setenv("RUNYARD_HOME", str(tmp_path / "b"))
    monkeypatch.setenv("RUNYARD_DB_URL", target_url)
    result = CliRunner().invoke(cli, ["db", "import", str(path)])
    assert result.exit_code == 0, result.output
    assert f"imported 26 rows of 18 tables from {path} into {target_url}" in result.output
    result = CliRunner().invoke(cli, ["db", "import", str(path)])
    assert result.exit_code == 1 and "error: the database" in result.output and "nothing was imported" in result.output
