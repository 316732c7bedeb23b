"""``GET /metrics``' series (app/server/prometheus.py) on a real database of runs in several states,
rendered in the text exposition format and read back with prometheus_client's own parser, as
Prometheus would: each run's numbers are the ones ``runyard show --json`` gives (the same
summaries, goodput and ETA), only active and recently ended runs have series, restarts are
counted by cause, GPUs are named by the UUIDs the scheduler published. The HTTP side (the scrape
token, refusals) is tried against the real server in tests/integration/test_prometheus.py.

    pytest tests/unit/app/server/test_prometheus.py
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.server.prometheus import DEFAULT_RECENT_S, RunyardCollector
from db import queries
from db.energy import save_tallies
from db.metricstore import write_points
from db.models import Alert, Attempt, SchedulerHeartbeat
from db.requests import create_run
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.energy import Method, Tally
from db.vocabulary.inventory import Inventory
from db.vocabulary.scheduler_file import SchedulerFile
from db.vocabulary.settings import EnvSettings, Settings, SettingsError
from db.vocabulary.settings_file import write_values

pytestmark = pytest.mark.both_dbs

HOST = "this-node"

RECENT_ENV = "RUNYARD_METRICS_RECENT_S"

UUIDS = ("GPU-00000000-aaaa-0000-0000-000000000000", "GPU-11111111-bbbb-1111-1111-111111111111",
         "GPU-22222222-cccc-2222-2222-222222222222")


@dataclass
class Scrape:
    """One scrape, parsed: every sample by its name and labels, and the families' types."""

    samples: dict[str, dict[frozenset[tuple[str, str]], float]]
    types: dict[str, str]

    def get(self, metric: str, **labels: str) -> float | None:
        return self.samples.get(metric, {}).get(frozenset(labels.items()))

    def runs(self) -> set[str]:
        """The run ids that have any series."""
        return {dict(key)["run_id"] for name, series in self.samples.items() if name.startswith("runyard_run_")
                for key in series}


def scrape(collector: RunyardCollector) -> Scrape:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    samples: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    types = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return Scrape(samples, types)


def _run(session: Session, settings: Settings, name: str, *path: str, at: float, max_steps: int = 300) -> int:
    config = RunConfig.model_validate({"name": name, "train": {"max_steps": max_steps}})
    run = create_run(session, config, settings.runs_dir, Price(usd_per_hour=3.6, unit="test-hour"))
    session.flush()
    for status in path:
        assert transition(session, run.id, RunStatus(status), f"test: {status}", now=at)
    return run.id


def _attempt(session: Session, run_id: int, number: int, status: str, started: float, **kw: object) -> None:
    session.add(Attempt(run_id=run_id, number=number, status=status, dir=f"/a/{run_id}/{number}",
                        started_at=started, **kw))


def _points(run_id: int, attempt: int, steps: range, end: float, steps_per_s: float) -> list[dict]:
    """Rank 0's loss and step time at each of ``steps``, ``steps_per_s`` steps a second up to ``end``."""
    last = steps[-1]
    rows = []
    for step in steps:
        wall = end - (last - step) / steps_per_s
        rows.append({"run_id": run_id, "attempt": attempt, "rank": 0, "step": step, "key": "loss",
                     "value": 1.0 / step, "wall_time": wall})
        rows.append({"run_id": run_id, "attempt": attempt, "rank": 0, "step": step, "key": "step_time",
                     "value": 1.0 / steps_per_s, "wall_time": wall})
    return rows


@pytest.fixture
def seeded(settings: Settings, sessions: sessionmaker[Session]) -> dict[str, int]:
    """Runs in every state that matters, by name: live (one after two failures), queued, ended
    recently (succeeded, failed) and ended two hours ago."""
    now = time.time()
    ids: dict[str, int] = {}
    with sessions() as s:
        ids["live"] = _run(s, settings, "live", "STARTING", "RUNNING", at=now - 600)
        _attempt(s, ids["live"], 1, "RUNNING", now - 600, first_step_at=now - 590, progress_at=now - 2,
                 last_step=200, devices_json="[2, 0]")
        ids["retried"] = _run(s, settings, "retried", "STARTING", "RUNNING", at=now - 900)
        _attempt(s, ids["retried"], 1, "FAILED", now - 900, first_step_at=now - 890, ended_at=now - 700,
                 last_step=80, cause="SIGNAL")
        _attempt(s, ids["retried"], 2, "FAILED", now - 690, first_step_at=now - 680, ended_at=now - 400,
                 last_step=120, resume_step=50, cause="HANG")
        _attempt(s, ids["retried"], 3, "RUNNING", now - 390, first_step_at=now - 380, progress_at=now - 5,
                 last_step=150, resume_step=100, devices_json="[1]")
        ids["queued"] = _run(s, settings, "queued", at=now)
        ids["done"] = _run(s, settings, "done", "STARTING", "RUNNING", "SUCCEEDED", at=now - 1200)
        _attempt(s, ids["done"], 1, "SUCCEEDED", now - 1800, first_step_at=now - 1790, progress_at=now - 1210,
                 ended_at=now - 1200, last_step=300, devices_json="[1]")
        ids["broke"] = _run(s, settings, "broke", "STARTING", "RUNNING", "FAILED", at=now - 60)
        _attempt(s, ids["broke"], 1, "FAILED", now - 300, first_step_at=now - 290, progress_at=now - 70,
                 ended_at=now - 60, last_step=40, cause="USER_ERROR")
        ids["old"] = _run(s, settings, "old", "STARTING", "RUNNING", "SUCCEEDED", at=now - 7200)
        _attempt(s, ids["old"], 1, "SUCCEEDED", now - 9000, first_step_at=now - 8990, progress_at=now - 7210,
                 ended_at=now - 7200, last_step=300)
        s.flush()
        write_points(s.connection(), _points(ids["live"], 1, range(10, 201, 10), now - 2, steps_per_s=5.0)
                     + _points(ids["retried"], 3, range(110, 151, 10), now - 5, steps_per_s=2.0)
                     + _points(ids["done"], 1, range(10, 301, 10), now - 1210, steps_per_s=0.5))
        s.commit()
    return ids


def collector(sessions: sessionmaker[Session], settings: Settings, **kw: object) -> RunyardCollector:
    return RunyardCollector(lambda: sessions, settings.scheduler_file, host=HOST, **kw)  # type: ignore[arg-type]


def test_each_run_has_the_numbers_runyard_show_gives(
        settings: Settings, sessions: sessionmaker[Session], seeded: dict[str, int]) -> None:
    # One clock for both reads: a live run's cost and goodput move with it (CI once saw the cost
    # 0.1% apart when the two reads were a moment apart on a loaded machine).
    now = time.time()
    got = scrape(collector(sessions, settings, clock=lambda: now))
    for name in ("live", "retried", "queued", "done", "broke"):
        run_id = str(seeded[name])
        with sessions() as s:
            shown = queries.run_detail(s, seeded[name], now)
        assert got.get("runyard_run_info", run_id=run_id, name=name, executor="local") == 1, name
        for state in RunStatus:
            assert got.get("runyard_run_state", run_id=run_id, state=state.value) == \
                (1 if state.value == shown["status"] else 0), (name, state)
        assert got.get("runyard_run_step", run_id=run_id) == shown["step"], name
        assert got.get("runyard_run_cost_dollars", run_id=run_id) == pytest.approx(shown["cost_usd"]), name
        eta = got.get("runyard_run_eta_seconds", run_id=run_id)
        assert (eta is None) == (shown["eta_s"] is None), name
        if eta is not None:
            assert eta == pytest.approx(shown["eta_s"]), name
        goodput = got.get("runyard_run_goodput_ratio", run_id=run_id)
        assert (goodput is None) == (shown["goodput"] is None), name
        if goodput is not None:
            assert goodput == pytest.approx(shown["goodput"]), name
    # What the seeding says, besides: the live run is at step 200 of 300 at 5 steps/s.
    live = str(seeded["live"])
    assert got.get("runyard_run_step", run_id=live) == 200
    assert got.get("runyard_run_eta_seconds", run_id=live) == pytest.approx(100 / 5.0)
    assert got.get("runyard_run_eta_seconds", run_id=str(seeded["done"])) == 0
    assert 0 < (got.get("runyard_run_goodput_ratio", run_id=live) or 0) <= 1


def test_your_cost_is_a_gauge_of_its_own_once_a_tariff_is_set(
        settings: Settings, sessions: sessionmaker[Session], seeded: dict[str, int]) -> None:
    now = time.time()
    run_id = str(seeded["live"])
    assert scrape(collector(sessions, settings, clock=lambda: now)).get("runyard_run_your_cost_dollars",
                                                                        run_id=run_id) is None
    write_values(settings.home, {("cost", "electricity_usd_per_kwh"): 0.30, ("cost", "hardware_usd_per_gpu"): 8760.0})
    got = scrape(collector(sessions, settings, clock=lambda: now))
    with sessions() as s:
        shown = queries.run_detail(s, seeded["live"], now)
    assert got.get("runyard_run_your_cost_dollars", run_id=run_id) == pytest.approx(shown["cost"]["yours"]["usd"])
    assert got.get("runyard_run_cost_dollars", run_id=run_id) == pytest.approx(shown["cost_usd"])  # apart


def test_steps_per_second_is_the_pace_the_eta_projects_with_and_only_while_running(
        settings: Settings, sessions: sessionmaker[Session], seeded: dict[str, int]) -> None:
    got = scrape(collector(sessions, settings))
    assert got.get("runyard_run_steps_per_second", run_id=str(seeded["live"])) == pytest.approx(5.0)
    assert got.get("runyard_run_steps_per_second", run_id=str(seeded["retried"])) == pytest.approx(2.0)
    for ended in ("done", "broke", "queued"):
        assert got.get("runyard_run_steps_per_second", run_id=str(seeded[ended])) is None, ended


def test_only_active_and_recently_ended_runs_have_series(
        settings: Settings, sessions: sessionmaker[Session], seeded: dict[str, int]) -> None:
    recent = {str(seeded[n]) for n in ("live", "retried", "queued", "done", "broke")}
    assert scrape(collector(sessions, settings)).runs() == recent
    # A longer window reaches the run that ended two hours ago; a shorter one keeps only the
    # runs that have not ended and the failure of a minute ago.
    assert scrape(collector(sessions, settings, recent_s=3 * 3600)).runs() == recent | {str(seeded["old"])}
    assert scrape(collector(sessions, settings, recent_s=600)).runs() == {
        str(seeded[n]) for n in ("live", "retried", "queued", "broke")}


def test_the_queue_counts_every_run_of_the_database_by_state(
        settings: Settings, sessions: sessionmaker[Session], seeded: dict[str, int]) -> None:
    got = scrape(collector(sessions, settings, recent_s=0))
    expected = {"RUNNING": 2, "QUEUED": 1, "SUCCEEDED": 2, "FAILED": 1}  # the old run counts too
    for state in RunStatus:
        assert got.get("runyard_queue_runs", state=state.value) == expected.get(state.value, 0), state


def test_restarts_are_counted_by_the_cause_of_the_attempt_before_them(
        settings: Settings, sessions: sessionmaker[Session], seeded: dict[str, int]) -> None:
    got = scrape(collector(sessions, settings))
    assert got.types["runyard_run_restarts"] == "counter"
    retried = str(seeded["retried"])
    assert got.samples["runyard_run_restarts_total"] == {
        frozenset({("run_id", retried), ("cause", "SIGNAL")}): 1,
        frozenset({("run_id", retried), ("cause", "HANG")}): 1,
    }  # the failed run was not restarted: its USER_ERROR counts nothing


def test_energy_is_a_counter_of_joules_per_run_with_its_method(
        settings: Settings, sessions: sessionmaker[Session], seeded: dict[str, int]) -> None:
    """The scheduler's tallies (db/energy/) as its meter leaves them: the live run's two GPUs
    measured, the retried run's last attempt estimated; runs never read have no series."""
    with sessions() as s:
        live = s.scalars(select(Attempt.id).where(Attempt.run_id == seeded["live"])).one()
        retried = s.scalars(select(Attempt.id).where(Attempt.run_id == seeded["retried"], Attempt.number == 3)).one()
        save_tallies(s, live, [Tally("gpu0", Method.MEASURED, 1000.0, 5000.0, time.time()),
                               Tally("gpu2", Method.MEASURED, 500.0, 9000.0, time.time())])
        save_tallies(s, retried, [Tally("gpu1", Method.ESTIMATED, 250.0, 300.0, time.time())])
        s.commit()
    got = scrape(collector(sessions, settings))
    assert got.types["runyard_run_energy_joules"] == "counter"
    assert got.samples["runyard_run_energy_joules_total"] == {
        frozenset({("run_id", str(seeded["live"])), ("method", "measured")}): pytest.approx(1500.0),
        frozenset({("run_id", str(seeded["retried"])), ("method", "not measured")}): pytest.approx(250.0),
    }  # attempts 1 and 2 of the retried run were never read: its total is a part, and says so


def test_the_last_step_time_is_the_newest_attempts_progress(
        settings: Settings, sessions: sessionmaker[Session], seeded: dict[str, int]) -> None:
    got = scrape(collector(sessions, settings))
    with sessions() as s:
        for name in ("live", "retried", "done", "broke"):
            newest = s.query(Attempt).filter_by(run_id=seeded[name]).order_by(Attempt.number.desc()).first()
            assert newest is not None
            assert got.get("runyard_run_last_step_timestamp_seconds", run_id=str(seeded[name])) == \
                pytest.approx(newest.progress_at), name
    assert got.get("runyard_run_last_step_timestamp_seconds", run_id=str(seeded["queued"])) is None
    stalled_for = time.time() - (got.get("runyard_run_last_step_timestamp_seconds", run_id=str(seeded["live"])) or 0)
    assert 2 <= stalled_for < 60  # what README's stalled-run rule computes


def test_gpus_are_named_by_uuid_for_the_running_attempts_of_this_host(
        settings: Settings, sessions: sessionmaker[Session], seeded: dict[str, int]) -> None:
    # Without a published inventory (no scheduler yet, or a CPU machine) no GPU is named.
    assert scrape(collector(sessions, settings)).samples.get("runyard_gpu_assigned_info", {}) == {}
    inventory = Inventory(kind="gpu", slots=3, gpu_names=("NVIDIA H100",) * 3, gpu_uuids=UUIDS)
    SchedulerFile(settings.scheduler_file).write({"written_at": time.time(), "inventory": inventory.to_json()})
    with sessions() as s:  # a run on another node of the same database holds its own GPU 0
        other = SchedulerHeartbeat(host="other-node", pid=1, started_at=time.time(), beat_at=time.time())
        s.add(other)
        s.flush()
        elsewhere = _run(s, settings, "elsewhere", "STARTING", "RUNNING", at=time.time())
        _attempt(s, elsewhere, 1, "RUNNING", time.time(), devices_json="[0]", scheduler_id=other.id)
        s.commit()
    got = scrape(collector(sessions, settings))
    live, retried = str(seeded["live"]), str(seeded["retried"])
    assert got.samples["runyard_gpu_assigned_info"] == {
        frozenset({("gpu_uuid", UUIDS[2]), ("run_id", live)}): 1,
        frozenset({("gpu_uuid", UUIDS[0]), ("run_id", live)}): 1,
        frozenset({("gpu_uuid", UUIDS[1]), ("run_id", retried)}): 1,
    }  # not the GPU the finished run held, nor the other node's


def test_alerts_firing_counts_the_open_alerts_by_trigger(
        settings: Settings, sessions: sessionmaker[Session], seeded: dict[str, int]) -> None:
    got = scrape(collector(sessions, settings))
    assert got.types["runyard_alerts_firing"] == "gauge"
    assert got.samples.get("runyard_alerts_firing", {}) == {}  # none yet
    now = time.time()
    with sessions() as s:
        for key, run, trigger, state in ((f"run:{seeded['live']}:hang:1", seeded["live"], "hang", "open"),
                                         (f"run:{seeded['retried']}:hang:1", seeded["retried"], "hang", "open"),
                                         (f"run:{seeded['live']}:stalled", seeded["live"], "stalled", "resolved"),
                                         ("scheduler:7", None, "scheduler", "open")):
            s.add(Alert(key=key, run_id=run, trigger=trigger, state=state, message="m", opened_at=now))
        s.commit()
    got = scrape(collector(sessions, settings))
    assert got.samples["runyard_alerts_firing"] == {frozenset({("trigger", "hang")}): 2,
                                                    frozenset({("trigger", "scheduler")}): 1}  # not the resolved one


def test_before_the_database_exists_only_the_queue_answers_with_zeros(settings: Settings) -> None:
    got = scrape(RunyardCollector(lambda: None, settings.scheduler_file, host=HOST))
    assert got.runs() == set()
    assert {got.get("runyard_queue_runs", state=s.value) for s in RunStatus} == {0}


def test_the_window_comes_from_the_environment_and_a_bad_value_is_named() -> None:
    assert EnvSettings.from_env({}).metrics_recent_s == DEFAULT_RECENT_S == 3600
    assert EnvSettings.from_env({RECENT_ENV: "600"}).metrics_recent_s == 600
    for bad in ("soon", "-5", "inf", "nan"):
        with pytest.raises(SettingsError, match=f"{RECENT_ENV} = '{bad}'"):
            EnvSettings.from_env({RECENT_ENV: bad})
