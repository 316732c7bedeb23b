"""The metric store on a real SQLite file and a real PostgreSQL database: rollups equal what
their raw points give at every level, whatever the order and batching of the points; series()
stays within max_points and since_step re-fetches exactly the newest buckets; NaN and infinities
come back as written."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from db import metricstore
from db.engine import make_engine, upgrade
from db.metricstore import BASE, LEVELS, MetricStoreError, series, write_points
from db.models import MetricRollup

NAN, INF = float("nan"), float("inf")
HYPOTHESIS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


pytestmark = pytest.mark.both_dbs


@pytest.fixture
def engine(migrated_url: str) -> Iterator[Engine]:
    engine = make_engine(migrated_url)
    yield engine
    engine.dispose()


def new_run(engine: Engine) -> int:
    with engine.begin() as conn:
        return conn.exec_driver_sql(
            "INSERT INTO runs (name, status, config_json, config_hash, tags_json, max_steps, nproc, run_dir, "
            "price_usd_per_hour, price_unit, created_at, updated_at) VALUES "
            "('r', 'RUNNING', '{}', 'h', '[]', 10, 2, '/x', 0.1, 'cpu', 1.0, 2.0) RETURNING id"
        ).scalar_one()


def write_in_batches(engine: Engine, rows: list[dict], cuts: list[int], *, one_transaction: bool = False) -> None:
    edges = [0, *sorted(c % (len(rows) + 1) for c in cuts), len(rows)]
    if one_transaction:
        with engine.begin() as conn:
            for lo, hi in pairwise(edges):
                write_points(conn, rows[lo:hi])
        return
    for lo, hi in pairwise(edges):
        with engine.begin() as conn:
            write_points(conn, rows[lo:hi])


def same(a: float, b: float) -> bool:
    """Equal, with NaN equal to NaN."""
    return (math.isnan(a) and math.isnan(b)) or a == b


def close(a: float, b: float) -> bool:
    return same(a, b) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def total_of(values: list[float]) -> float:
    """The sum of the non-NaN values (NaN when +Inf meets -Inf)."""
    finite = [v for v in values if not math.isnan(v)]
    if INF in finite or -INF in finite:
        return sum(finite)  # inf, -inf or nan
    return math.fsum(finite)


def mean_of(values: list[float]) -> float:
    """What a rollup's mean must be: over the non-NaN values, NaN when none or when +Inf meets -Inf."""
    n = sum(not math.isnan(v) for v in values)
    return total_of(values) / n if n else NAN


values = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.sampled_from([NAN, INF, -INF, 0.0]),
)
point = st.tuples(
    st.sampled_from(["loss", "lr"]),  # key
    st.integers(1, 2),  # attempt
    st.integers(0, 2),  # rank
    st.one_of(st.integers(0, 80), st.integers(0, 5000)),  # step: dense buckets and a long tail
    values,
)


def to_rows(run_id: int, points: list[tuple]) -> list[dict[str, Any]]:
    return [
        {"run_id": run_id, "key": k, "attempt": a, "rank": r, "step": s, "value": v, "wall_time": 1000.0 + i}
        for i, (k, a, r, s, v) in enumerate(points)
    ]


def kept(rows: list[dict]) -> dict[tuple, dict]:
    """The stored points: the first write of each (key, attempt, rank, step) wins."""
    out: dict[tuple, dict] = {}
    for r in rows:
        out.setdefault((r["key"], r["attempt"], r["rank"], r["step"]), r)
    return out


def expected_buckets(points: dict[tuple, dict], key: str, level: int) -> list[dict[str, Any]]:
    size = BASE**level
    groups: dict[tuple, list[dict]] = {}
    for (k, attempt, rank, step), r in points.items():
        if k == key:
            groups.setdefault((attempt, rank, step // size), []).append(r)
    out = []
    for (attempt, rank, bucket), rs in sorted(groups.items()):
        last = max(rs, key=lambda r: r["step"])
        vals = [r["value"] for r in rs]
        finite = [v for v in vals if not math.isnan(v)]
        out.append({
            "attempt": attempt, "rank": rank, "step": bucket * size if level else last["step"],
            "last_step": last["step"], "value": mean_of(vals), "min": min(finite) if finite else NAN,
            "max": max(finite) if finite else NAN, "last": last["value"], "count": len(rs),
            "nan_count": len(vals) - len(finite), "wall_time": last["wall_time"],
        })
    return out


def assert_rows_equal(got: list[dict], want: list[dict]) -> None:
    assert [(r["attempt"], r["rank"], r["step"]) for r in got] == [(r["attempt"], r["rank"], r["step"]) for r in want]
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for field in ("last_step", "count", "nan_count", "wall_time"):
            assert g[field] == w[field], (field, g, w)
        for field in ("min", "max", "last"):
            assert same(g[field], w[field]), (field, g, w)
        assert close(g["value"], w["value"]), (g, w)


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=200), cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_every_level_equals_its_raw_points(engine: Engine, points: list[tuple], cuts: list[int]) -> None:
    run_id = new_run(engine)
    rows = to_rows(run_id, points)
    write_in_batches(engine, rows, cuts)
    stored = kept(rows)
    with Session(engine) as s:
        for key in ("loss", "lr"):
            for level in range(LEVELS + 1):
                got = series(s, run_id, key, level=level)
                assert got.bucket_steps == BASE**level
                assert_rows_equal(got.rows, expected_buckets(stored, key, level))
                steps = [step for (k, _, _, step) in stored if k == key]
                assert got.max_step == (max(steps) if steps else None)


def rollup_table(engine: Engine, run_id: int) -> list[tuple]:
    R = MetricRollup
    cols = [c for c in R.__table__.columns if c.name != "run_id"]
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(*cols).where(R.run_id == run_id).order_by(*cols[:5]))]


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=150), cuts=st.lists(st.integers(0, 10_000), min_size=1, max_size=8),
       seed=st.integers(0, 2**16))
def test_batches_and_order_give_the_rollups_of_one_batch(engine: Engine, points: list[tuple], cuts: list[int],
                                                         seed: int) -> None:
    # Distinct points, so that "first write wins" does not depend on the order.
    unique = list({(k, a, r, s): (k, a, r, s, v) for k, a, r, s, v in points}.values())
    one, many, together = new_run(engine), new_run(engine), new_run(engine)
    write_in_batches(engine, to_rows(one, unique), [])
    for run_id, one_transaction in ((many, False), (together, True)):  # a batch per transaction, or all in one
        shuffled = to_rows(run_id, unique)
        random.Random(seed).shuffle(shuffled)
        write_in_batches(engine, shuffled, cuts, one_transaction=one_transaction)
    a = rollup_table(engine, one)
    sum_at = list(MetricRollup.__table__.columns.keys()).index("sum_value") - 1
    for b in (rollup_table(engine, many), rollup_table(engine, together)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert x[:sum_at] == y[:sum_at] and x[sum_at + 1:] == y[sum_at + 1:]
            assert (x[sum_at] is None and y[sum_at] is None) or close(x[sum_at], y[sum_at])


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=200), max_points=st.integers(1, 60))
def test_series_stays_within_max_points(engine: Engine, points: list[tuple], max_points: int) -> None:
    run_id = new_run(engine)
    rows = to_rows(run_id, points)
    write_in_batches(engine, rows, [])
    stored = kept(rows)
    with Session(engine) as s:
        got = series(s, run_id, "loss", max_points=max_points)
    per_series: dict[tuple[int, int], int] = {}
    for r in got.rows:
        per_series[(r["attempt"], r["rank"])] = per_series.get((r["attempt"], r["rank"]), 0) + 1
    assert all(n <= max_points for n in per_series.values())
    points_per_series: dict[tuple[int, int], int] = {}
    for (k, a, r, _) in stored:
        if k == "loss":
            points_per_series[(a, r)] = points_per_series.get((a, r), 0) + 1
    if all(n <= max_points for n in points_per_series.values()):
        assert got.level == 0  # a short run is drawn from its raw points
    assert sum(r["count"] for r in got.rows) == sum(points_per_series.values())


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=200), since=st.integers(0, 5100), level=st.integers(0, LEVELS))
def test_since_step_returns_the_same_rows_as_a_full_fetch(engine: Engine, points: list[tuple], since: int,
                                                          level: int) -> None:
    run_id = new_run(engine)
    write_in_batches(engine, to_rows(run_id, points), [])
    with Session(engine) as s:
        full = series(s, run_id, "lr", level=level)
        newest = series(s, run_id, "lr", level=level, since_step=since)
        auto = series(s, run_id, "lr", max_points=7)
        auto_newest = series(s, run_id, "lr", max_points=7, since_step=since)
    assert_rows_equal(newest.rows, [r for r in full.rows if r["last_step"] >= since])
    assert auto_newest.level == auto.level
    assert_rows_equal(auto_newest.rows, [r for r in auto.rows if r["last_step"] >= since])


def test_a_live_chart_refetches_only_the_newest_bucket(engine: Engine) -> None:
    run_id = new_run(engine)
    rows = [{"run_id": run_id, "key": "loss", "attempt": 1, "rank": r, "step": s, "value": 1.0 / s, "wall_time": s}
            for s in range(1, 1001) for r in range(8)]
    write_in_batches(engine, rows, [])
    with Session(engine) as s:
        full = series(s, run_id, "loss", max_points=100)
        # 1000 points > 100, 251 buckets of 4 > 100, 63 buckets of 16 <= 100.
        assert full.level == 2 and full.bucket_steps == 16 and full.max_step == 1000
        assert len(full.rows) == 8 * 63
        newest = series(s, run_id, "loss", level=full.level, since_step=full.rows[-1]["step"])
    assert [(r["rank"], r["step"], r["count"]) for r in newest.rows] == [(r, 992, 9) for r in range(8)]


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


def test_an_unknown_key_or_run_is_an_empty_series(engine: Engine) -> None:
    run_id = new_run(engine)
    with Session(engine) as s:
        got = series(s, run_id, "loss")
        assert (got.level, got.bucket_steps, got.rows, got.max_step) == (0, 1, [], None)
        assert metricstore.latest(s, run_id) == {} and metricstore.metric_keys(s, run_id) == []
        assert metricstore.totals(s, run_id, "loss", attempt=1, rank=0) == (0.0, 0)


@HYPOTHESIS
@given(points=st.lists(point, min_size=1, max_size=200), max_step=st.one_of(st.none(), st.integers(0, 5100)))
def test_totals_sum_the_non_nan_values_up_to_a_step(engine: Engine, points: list[tuple], max_step: int | None) -> None:
    run_id = new_run(engine)
    rows = to_rows(run_id, points)
    write_in_batches(engine, rows, [])
    stored = kept(rows)
    with Session(engine) as s:
        for attempt in (1, 2):
            total, count = metricstore.totals(s, run_id, "loss", attempt=attempt, rank=1, max_step=max_step)
            vals = [r["value"] for (k, a, rank, step), r in stored.items()
                    if (k, a, rank) == ("loss", attempt, 1) and (max_step is None or step <= max_step)]
            assert count == sum(not math.isnan(v) for v in vals)
            assert close(total, total_of(vals))


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
        return tuple(conn.execute(text(  # type: ignore[return-value]
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
