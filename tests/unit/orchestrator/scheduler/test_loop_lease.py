"""Several schedulers on one database: each queued run is launched exactly once, and a scheduler
leaves another live scheduler's attempts alone until that one's lease expires (db/lease.py).

Two ``Scheduler`` objects stand for two nodes: they share the database and tell themselves apart
by host name (``host=``), as schedulers on two machines would. Their ``tick()`` runs on two
threads released together by a barrier, so that both read the same queue and race to claim it.
The launched command is the small program of tests/unit/orchestrator/fake_runs.py; every launch is also
counted by the command factory itself, so a run launched twice shows even without a second row.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_sessionmaker, upgrade
from db.lease import LEASE_S
from db.models import Attempt, Event, Run, SchedulerHeartbeat
from db.requests import request_cancel
from db.vocabulary.config import RunConfig
from db.vocabulary.settings import Settings
from orchestrator.scheduler.loop import Scheduler
from orchestrator.scheduler.service import SchedulerLocked, refuse_a_second_on_sqlite
from tests.conftest import kill_processes_of
from tests.unit.orchestrator.fake_runs import CPU2, fake_command, queue, status, tick_until


@pytest.fixture
def shared(db_url: str, tmp_path: Path) -> Iterator[tuple[sessionmaker[Session], Settings]]:
    """One database and one data folder, upgraded through the real migrations."""
    home = tmp_path / "home"
    upgrade(db_url)
    engine = make_engine(db_url)
    settings = Settings(home=home, db_url=db_url)
    try:
        yield make_sessionmaker(engine), settings
    finally:
        kill_processes_of(home)
        engine.dispose()


class Launches:
    """The command factory, counting each launch by (run, attempt)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[int, int]] = []

    def __call__(self, config: RunConfig, run_id: int, attempt: int, port: int, attempt_dir: Path,
                 **kwargs: object) -> list[str]:
        with self.lock:
            self.seen.append((run_id, attempt))
        return fake_command(config, run_id, attempt, port, attempt_dir, **kwargs)


def node(sessions: sessionmaker[Session], settings: Settings, host: str, launches: Launches) -> Scheduler:
    return Scheduler(sessions, settings, CPU2, command=launches, host=host)


def tick_together(schedulers: list[Scheduler], rounds: int) -> None:
    """``rounds`` ticks of every scheduler, each on its own thread, started together each round."""
    barrier = threading.Barrier(len(schedulers))
    failures: list[BaseException] = []

    def loop(scheduler: Scheduler) -> None:
        try:
            for _ in range(rounds):
                barrier.wait(timeout=60)
                scheduler.tick()
                time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=loop, args=(s,)) for s in schedulers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_two_schedulers_launch_each_queued_run_exactly_once(shared: tuple[sessionmaker[Session], Settings]) -> None:
    sessions, settings = shared
    runs = [queue(sessions, settings, "quick") for _ in range(8)]
    launches = Launches()
    a, b = node(sessions, settings, "node-a", launches), node(sessions, settings, "node-b", launches)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(status(sessions, r) == "SUCCEEDED" for r in runs):
        tick_together([a, b], rounds=5)
    assert [status(sessions, r) for r in runs] == ["SUCCEEDED"] * len(runs)
    assert sorted(launches.seen) == [(r, 1) for r in runs]  # each run launched once, by one of the two
    with sessions() as s:
        rows = s.execute(select(Attempt.run_id, Attempt.number, Attempt.scheduler_id)).all()
        nodes = dict(s.execute(select(SchedulerHeartbeat.id, SchedulerHeartbeat.host)).all())
        takeovers = s.scalars(select(Event.message).where(Event.kind == "scheduler")).all()
    assert sorted((r, n) for r, n, _ in rows) == [(r, 1) for r in runs]
    assert all(owner is not None and nodes[owner] in ("node-a", "node-b") for _, _, owner in rows)
    assert takeovers == []  # neither took the other's attempts while both were alive


def test_a_live_scheduler_s_attempt_is_left_alone_until_its_lease_expires(
        shared: tuple[sessionmaker[Session], Settings]) -> None:
    sessions, settings = shared
    run_id = queue(sessions, settings, "long")
    launches = Launches()
    a, b = node(sessions, settings, "node-a", launches), node(sessions, settings, "node-b", launches)
    a.tick()
    assert status(sessions, run_id) == "STARTING"
    a_id, b_id = a.identity(), None
    assert a_id is not None
    for _ in range(5):
        b.tick()
    b_id = b.identity()
    assert b_id is not None and b_id.id != a_id.id
    with sessions() as s:
        attempt = s.scalars(select(Attempt).where(Attempt.run_id == run_id)).one()
        assert attempt.scheduler_id == a_id.id and attempt.status == "RUNNING"
    with sessions() as s:  # b cannot cancel it: a signals its own attempts
        request_cancel(s, run_id)
        s.commit()
    for _ in range(5):
        b.tick()
    assert status(sessions, run_id) == "CANCELLING"

    # a stops beating: once its lease is older than LEASE_S, b takes the attempt over; the
    # processes still live on this host, so b re-adopts them and carries out the cancel.
    with sessions() as s:
        s.execute(update(SchedulerHeartbeat).where(SchedulerHeartbeat.id == a_id.id)
                  .values(beat_at=time.time() - LEASE_S - 1))
        s.commit()
    tick_until(b, lambda: status(sessions, run_id) == "CANCELLED")
    with sessions() as s:
        attempt = s.scalars(select(Attempt).where(Attempt.run_id == run_id)).one()
        events = s.scalars(select(Event.message).where(Event.run_id == run_id, Event.kind == "scheduler")).all()
    assert attempt.scheduler_id == b_id.id and attempt.status == "CANCELLED"
    assert len(events) == 1 and f"taken over by scheduler #{b_id.id}" in events[0]
    assert f"from scheduler #{a_id.id} (pid {os.getpid()} on node-a" in events[0]
    assert launches.seen == [(run_id, 1)]


def test_a_restarted_scheduler_takes_over_its_data_folder_s_attempts_at_once(
        shared: tuple[sessionmaker[Session], Settings]) -> None:
    """Same host, same data folder: the folder's scheduler lock says the old one has exited, so the
    new one re-adopts without waiting out the lease (as before leases)."""
    sessions, settings = shared
    run_id = queue(sessions, settings, "medium")
    launches = Launches()
    old = node(sessions, settings, "node-a", launches)
    old.tick()
    new = node(sessions, settings, "node-a", launches)
    tick_until(new, lambda: status(sessions, run_id) == "SUCCEEDED")
    new_id = new.identity()
    assert new_id is not None
    with sessions() as s:
        attempt = s.scalars(select(Attempt).where(Attempt.run_id == run_id)).one()
    assert attempt.scheduler_id == new_id.id and attempt.status == "SUCCEEDED"
    assert launches.seen == [(run_id, 1)]  # re-adopted, not launched again


def test_devices_are_counted_per_host(shared: tuple[sessionmaker[Session], Settings]) -> None:
    """Runs on another node do not hold this node's slots."""
    sessions, settings = shared
    first = queue(sessions, settings, "long", nproc=2)
    second = queue(sessions, settings, "long", nproc=2)
    launches = Launches()
    a, b = node(sessions, settings, "node-a", launches), node(sessions, settings, "node-b", launches)
    a.tick()
    assert [status(sessions, r) for r in (first, second)] == ["STARTING", "QUEUED"]
    b.tick()
    assert [status(sessions, r) for r in (first, second)] == ["STARTING", "STARTING"]
    with sessions() as s:
        for run_id in (first, second):
            request_cancel(s, run_id)
        s.commit()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and {status(sessions, r) for r in (first, second)} != {"CANCELLED"}:
        a.tick()
        b.tick()
        time.sleep(0.1)
    assert [status(sessions, r) for r in (first, second)] == ["CANCELLED", "CANCELLED"]


def test_sqlite_refuses_a_second_scheduler_of_another_data_folder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    upgrade(url)
    sessions = make_sessionmaker(make_engine(url))
    first = Settings(home=tmp_path / "one", db_url=url)
    Scheduler(sessions, first, CPU2, command=Launches()).tick()  # its lease is live now
    refuse_a_second_on_sqlite(sessions, first)  # the same folder restarting: allowed
    with pytest.raises(SchedulerLocked) as refused:
        refuse_a_second_on_sqlite(sessions, Settings(home=tmp_path / "two", db_url=url))
    assert f"data folder {tmp_path / 'one'}) already uses the SQLite database {url}" in str(refused.value)
    assert "point RUNYARD_DB_URL at PostgreSQL" in str(refused.value)
    with sessions() as s:  # once its lease has expired the database is free again
        s.execute(update(SchedulerHeartbeat).values(beat_at=time.time() - LEASE_S - 1))
        s.commit()
    refuse_a_second_on_sqlite(sessions, Settings(home=tmp_path / "two", db_url=url))


def test_runs_rows_untouched_by_the_loser(shared: tuple[sessionmaker[Session], Settings]) -> None:
    """The losing scheduler writes no history row: one STARTING entry per launched run."""
    sessions, settings = shared
    runs = [queue(sessions, settings, "long") for _ in range(2)]
    launches = Launches()
    a, b = node(sessions, settings, "node-a", launches), node(sessions, settings, "node-b", launches)
    tick_together([a, b], rounds=1)
    with sessions() as s:
        starts = s.execute(text("SELECT run_id FROM run_status_history WHERE to_status = 'STARTING'")).all()
        statuses = s.scalars(select(Run.status).order_by(Run.id)).all()
    assert statuses == ["STARTING", "STARTING"]
    assert sorted(r for (r,) in starts) == runs
    assert sorted(launches.seen) == [(r, 1) for r in runs]
    with sessions() as s:
        for run_id in runs:
            request_cancel(s, run_id)
        s.commit()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and {status(sessions, r) for r in runs} != {"CANCELLED"}:
        a.tick()
        b.tick()
        time.sleep(0.1)
