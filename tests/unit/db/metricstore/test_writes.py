"""The metric store's write path (db/metricstore/writes.py) on a real SQLite file and a real
PostgreSQL database: NaN and infinities come back as written, a point written twice keeps its
first value, a run's points go with the run, and a point of a run that does not exist is
refused.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from db import metricstore
from db.engine import make_engine, upgrade
from db.metricstore import LEVELS, MetricStoreError, series, write_points
from tests.unit.db.metricstore.generated_points import INF, NAN, engine, new_run, same

__all__ = ["engine"]  # the fixtures, from the helper module


pytestmark = pytest.mark.both_dbs


def test_nan_and_infinities_come_back_as_written(engine: Engine) -> None:
    run_id = new_run(engine)
    written = [NAN, INF, -INF, 1.5]
    rows = [{"run_id": run_id, "key": "loss", "attempt": 1, "rank": 0, "step": i, "value": v, "wall_time": float(i)}
            for i, v in enumerate(written)]
    rows.append({"run_id": run_id, "key": "acc", "attempt": 1, "rank": 0, "step": 0, "value": NAN, "wall_time": 0.0})
    with engine.begin() as conn:
        write_points(conn, rows)
    with Session(engine) as s:
        raw = series(s, run_id, "loss", level=0).rows
        assert all(same(r["value"], v) for r, v in zip(raw, written, strict=True))
        assert raw[0]["nan_count"] == 1 and math.isnan(raw[0]["min"])
        (bucket,) = series(s, run_id, "loss", level=1).rows
        assert math.isnan(bucket["value"])  # +Inf and -Inf meet
        assert (bucket["min"], bucket["max"], bucket["last"], bucket["count"], bucket["nan_count"]) == (
            -INF, INF, 1.5, 4, 1)
        (only_nan,) = series(s, run_id, "acc", level=3).rows
        assert all(math.isnan(only_nan[f]) for f in ("value", "min", "max", "last"))
        latest = metricstore.latest(s, run_id)
        assert latest["loss"] == {"0": 1.5} and math.isnan(latest["acc"]["0"])
        exported = list(metricstore.iter_rows(s, run_id))
        assert [(k, st) for _, _, st, k, _, _ in exported] == [
            ("acc", 0), ("loss", 0), ("loss", 1), ("loss", 2), ("loss", 3)]
        assert math.isnan(exported[0][4]) and math.isnan(exported[1][4]) and exported[2][4] == INF
        assert [v for _, v, _ in metricstore.recent(s, run_id, "loss", attempt=1, rank=0, limit=3)] == [1.5, -INF, INF]


def test_a_point_written_twice_keeps_its_first_value(engine: Engine) -> None:
    run_id = new_run(engine)
    row = {"run_id": run_id, "key": "loss", "attempt": 1, "rank": 0, "step": 7, "value": 1.0, "wall_time": 1.0}
    with engine.begin() as conn:
        write_points(conn, [row, {**row, "value": 2.0}])
    with engine.begin() as conn:
        write_points(conn, [{**row, "value": 3.0}, {**row, "step": 8, "value": 4.0}])
    with Session(engine) as s:
        assert [r["value"] for r in series(s, run_id, "loss", level=0).rows] == [1.0, 4.0]
        (bucket,) = series(s, run_id, "loss", level=2).rows
        assert (bucket["count"], bucket["value"], bucket["last"]) == (2, 2.5, 4.0)


def test_a_batch_over_two_runs_and_attempts_drops_only_the_points_already_stored(engine: Engine) -> None:
    runs = new_run(engine), new_run(engine)

    def row(run_id: int, attempt: int, step: int, value: float) -> dict[str, Any]:
        return {"run_id": run_id, "key": "loss", "attempt": attempt, "rank": 0, "step": step, "value": value,
                "wall_time": float(step)}

    with engine.begin() as conn:
        write_points(conn, [row(runs[0], 1, 4, 1.0), row(runs[1], 2, 9, 1.0), row(runs[1], 2, 10, 1.0)])
    # One batch: each (run, attempt) has a step range, and in each one points are already stored
    # (at its ends too).
    with engine.begin() as conn:
        write_points(conn, [row(runs[0], 1, step, 2.0) for step in (4, 5, 6)]
                     + [row(runs[1], 2, step, 2.0) for step in (8, 9, 10)] + [row(runs[1], 1, 9, 2.0)])
    with Session(engine) as s:
        first = series(s, runs[0], "loss", level=0).rows
        assert [(r["step"], r["value"]) for r in first] == [(4, 1.0), (5, 2.0), (6, 2.0)]
        second = series(s, runs[1], "loss", level=0).rows
        assert [(r["attempt"], r["step"], r["value"]) for r in second] == [(1, 9, 2.0), (2, 8, 2.0), (2, 9, 1.0),
                                                                          (2, 10, 1.0)]
        (bucket,) = [r for r in series(s, runs[1], "loss", level=LEVELS).rows if r["attempt"] == 2]
        assert (bucket["count"], bucket["value"]) == (3, 4.0 / 3)


def test_names_created_in_a_rolled_back_transaction_are_not_reused(engine: Engine) -> None:
    run_id = new_run(engine)
    row = {"run_id": run_id, "key": "grad_norm", "attempt": 1, "rank": 0, "step": 1, "value": 1.0, "wall_time": 1.0}
    with engine.connect() as conn:  # the same pooled connection (and name cache) is used below
        write_points(conn, [{**row, "key": "never_committed"}])
        conn.rollback()
    with engine.begin() as conn:
        write_points(conn, [row])
        write_points(conn, [{**row, "step": 2}])  # the cached id
    with Session(engine) as s:
        assert metricstore.metric_keys(s, run_id) == ["grad_norm"]
        assert [r["step"] for r in series(s, run_id, "grad_norm").rows] == [1, 2]


def test_the_writers_connection_skips_key_checks_and_the_others_keep_them(tmp_path: Path) -> None:
    """Rank 0's writer opens its engine with ``foreign_keys=False`` (the checks were a tenth of
    the ingest time); every other connection keeps SQLite's foreign keys, so deleting a run
    still takes the points the writer wrote with it."""
    url = f"sqlite:///{tmp_path / 'metrics.db'}"
    upgrade(url)
    app, writer = make_engine(url), make_engine(url, foreign_keys=False)
    try:
        run_id = new_run(app)
        row = {"run_id": run_id, "key": "loss", "attempt": 1, "rank": 0, "step": 1, "value": 1.0, "wall_time": 1.0}
        with writer.begin() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 0
            write_points(conn, [row, {**row, "rank": 1}])
        with app.begin() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("SELECT count(*) FROM metric_points").scalar() == 2
            conn.exec_driver_sql("DELETE FROM runs WHERE id = ?", (run_id,))
            assert conn.exec_driver_sql("SELECT count(*) FROM metric_points").scalar() == 0
            assert conn.exec_driver_sql("SELECT count(*) FROM metric_rollups").scalar() == 0
        with pytest.raises(sqlalchemy.exc.IntegrityError), app.begin() as conn:
            write_points(conn, [{**row, "run_id": run_id + 100}])  # no such run: refused here
    finally:
        app.dispose()
        writer.dispose()


def _rows_of(engine: Engine, run_id: int) -> tuple[int, int]:
    """How many points and rollup rows ``run_id`` has."""
    with engine.connect() as conn:
        return tuple(conn.execute(text(
            "SELECT (SELECT count(*) FROM metric_points WHERE run_id = :id), "
            "(SELECT count(*) FROM metric_rollups WHERE run_id = :id)"), {"id": run_id}).one())


def _points_of(run_id: int, steps: range) -> list[dict[str, Any]]:
    return [{"run_id": run_id, "key": key, "attempt": 1, "rank": rank, "step": step, "value": 1.0 / (1 + step),
             "wall_time": 100.0 + step} for step in steps for rank in (0, 1) for key in ("loss", "lr")]


def test_deleting_a_run_deletes_its_points_and_rollups(migrated_url: str, db_dialect: str) -> None:
    """What rank 0's writer wrote goes with its run, and no other run's: on SQLite through the
    keys' cascade (from any connection but the writer's), on PostgreSQL, which has no keys on
    the metric tables, through the triggers on runs (migration 0010), for DELETE and for
    TRUNCATE ... CASCADE alike."""
    app, writer = make_engine(migrated_url), make_engine(migrated_url, foreign_keys=False)
    try:
        gone, stays = new_run(app), new_run(app)
        for run_id in (gone, stays):
            with writer.begin() as conn:
                write_points(conn, _points_of(run_id, range(50)))
        kept = _rows_of(app, stays)
        assert _rows_of(app, gone) == kept and kept[0] == 200 and kept[1] > 0
        with app.begin() as conn:
            conn.execute(text("DELETE FROM runs WHERE id = :id"), {"id": gone})
        assert (_rows_of(app, gone), _rows_of(app, stays)) == ((0, 0), kept)
        with app.begin() as conn:
            conn.execute(text("TRUNCATE runs CASCADE" if db_dialect == "postgres" else "DELETE FROM runs"))
        assert _rows_of(app, stays) == (0, 0)
    finally:
        app.dispose()
        writer.dispose()


def test_points_of_a_run_that_does_not_exist_are_refused(migrated_url: str, db_dialect: str) -> None:
    """On PostgreSQL the writer's own check refuses the batch (naming the run), since no key
    does; on SQLite the key does, on every connection but the writer's (see the test above)."""
    engine = make_engine(migrated_url)
    try:
        run_id = new_run(engine)
        refused: Any = (pytest.raises(MetricStoreError, match=rf"run_id \[{run_id + 100}\]")
                        if db_dialect == "postgres" else pytest.raises(sqlalchemy.exc.IntegrityError))
        with refused, engine.begin() as conn:
            write_points(conn, _points_of(run_id, range(3)) + _points_of(run_id + 100, range(3)))
        assert _rows_of(engine, run_id) == (0, 0)
    finally:
        engine.dispose()


def test_a_run_deleted_during_a_batch_waits_for_it_and_takes_its_points(migrated_url: str,
                                                                          db_dialect: str) -> None:
    """DELETE of a run whose writer has a batch open waits until the batch commits, then deletes
    the batch's points too: no point outlives its run. PostgreSQL: the writer's batch holds the
    run FOR KEY SHARE, as a key's check would; SQLite: the writer holds the database's write
    lock."""
    app, writer = make_engine(migrated_url), make_engine(migrated_url, foreign_keys=False)
    try:
        run_id = new_run(app)

        def delete_run() -> None:
            with app.begin() as conn:
                conn.execute(text("DELETE FROM runs WHERE id = :id"), {"id": run_id})

        deleter = threading.Thread(target=delete_run)
        with writer.begin() as conn:
            write_points(conn, _points_of(run_id, range(20)))
            deleter.start()
            if db_dialect == "postgres":
                assert _waits_on_a_lock(writer, "DELETE FROM runs")
            deleter.join(0.5)
            assert deleter.is_alive()  # waiting for this batch
        deleter.join(20)
        assert not deleter.is_alive()
        assert _rows_of(app, run_id) == (0, 0)
    finally:
        app.dispose()
        writer.dispose()


def _waits_on_a_lock(engine: Engine, query: str, timeout_s: float = 10.0) -> bool:
    """Whether a PostgreSQL backend running ``query`` waits on a lock within ``timeout_s``.

    Each look in a transaction of its own: PostgreSQL reads pg_stat_activity once per transaction
    and answers from that snapshot until it ends, so a loop in one transaction never saw a DELETE
    that began waiting after its first look (CI 40, on a loaded machine: "assert False")."""
    deadline = time.monotonic() + timeout_s
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                        "AND query LIKE :q"), {"q": query + "%"}).scalar_one()
            conn.rollback()  # ends the transaction, and its snapshot of the statistics
            if waiting:
                return True
            time.sleep(0.05)
    return False


@pytest.mark.parametrize("key", ["step", "rank"])
def test_a_key_beyond_postgres_integer_is_refused_there_and_stored_on_sqlite(engine: Engine, db_dialect: str,
                                                                             key: str) -> None:
    """PostgreSQL's INTEGER stops at 2**31 - 1; a larger step or rank is refused by name (binary
    COPY would store it wrapped around), never stored as another one. SQLite's integers are
    64-bit."""
    run_id = new_run(engine)
    rows = [{**row, key: 2**31 + row["step"]} for row in _points_of(run_id, range(3))]
    if db_dialect == "postgres":
        with pytest.raises(MetricStoreError, match=rf"{key}=214748364[89] is outside PostgreSQL's INTEGER"), \
                engine.begin() as conn:
            write_points(conn, rows)
        assert _rows_of(engine, run_id) == (0, 0)
    else:
        with engine.begin() as conn:
            write_points(conn, rows)
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT max({key}) FROM metric_points")).scalar_one() == 2**31 + 2
