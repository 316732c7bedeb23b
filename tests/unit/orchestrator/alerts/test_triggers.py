"""What fires an alert (orchestrator/alerts/triggers.py, read by the engine from the database): a
NaN, the budget's crossings, a stalled or idle run, a run finished, the scheduler back, an ETA
that slips, the day's budget, a retry and the checkpoint it resumes from, a hang and its rank's
top frames; each said once, and resolved. The runs are small programs the scheduler's loop drives.
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.metricstore import write_points
from db.models import Alert, Attempt, Checkpoint, Event, Run, SchedulerHeartbeat, SystemMetric
from db.vocabulary.config import parse_config
from db.vocabulary.settings import Settings
from orchestrator.alerts.engine import AlertEngine
from orchestrator.alerts.findings import rules_for
from orchestrator.alerts.store import AlertStore
from orchestrator.alerts.triggers import Evaluator
from orchestrator.executors.stack_reading import RankStack
from orchestrator.executors.stacks import StackDump
from orchestrator.scheduler.attempts import resume_point
from orchestrator.scheduler.watchdog import top_frames_of
from tests.alert_receivers import http_receiver
from tests.unit.orchestrator.alerts.alert_runs import cancel, drain, engine_and_worker, running_attempt
from tests.unit.orchestrator.fake_runs import make_scheduler, queue, status, tick_until


def test_nan_fires_once_names_the_ranks_and_resolves(sessions: sessionmaker[Session], settings: Settings) -> None:
    with http_receiver() as receiver:
        store = AlertStore(settings.home)
        store.add(receiver.url("runyard+http", "/hook"))
        run_id, scheduler = running_attempt(sessions, settings)
        engine, worker = engine_and_worker(sessions, settings)
        now = time.time()
        with sessions() as s:
            write_points(s.connection(), [
                dict(run_id=run_id, attempt=1, rank=r, step=40, key="loss", value=v, wall_time=now)
                for r, v in ((0, 2.0), (1, float("nan")))])
            s.get_one(Attempt, 1).last_step = 40
            s.commit()
        engine.evaluate()
        engine.evaluate()
        with sessions() as s:
            write_points(s.connection(), [
                dict(run_id=run_id, attempt=1, rank=r, step=50, key="loss", value=1.5, wall_time=now + 1)
                for r in (0, 1)])
            s.commit()
        engine.evaluate()
        drain(worker)
        posts = [p.json for p in receiver.posts]
        cancel(sessions, scheduler, run_id)
    assert [(p["trigger"], p["kind"]) for p in posts] == [("nonfinite", "fire"), ("nonfinite", "resolved")]
    assert "loss NaN on rank(s) 1 at step 40" in posts[0]["message"]
    assert "no longer nonfinite" in posts[1]["message"]


def test_budget_crossings_fire_at_50_80_100_and_pause_the_run(sessions: sessionmaker[Session],
                                                              settings: Settings) -> None:
    with http_receiver() as receiver:
        AlertStore(settings.home).add(receiver.url("runyard+http", "/hook"))
        run_id, scheduler = running_attempt(sessions, settings, alerts={"budget_usd": 1.0, "budget_pause": True})
        engine, worker = engine_and_worker(sessions, settings)
        fired = []
        for elapsed in (0.3, 0.6, 0.7, 0.9, 1.2):  # the attempt's age at $1 a second
            now = time.time()  # the pass sees this age exactly, however late it runs under load
            with sessions() as s:
                s.get_one(Run, run_id).price_usd_per_hour = 3600.0
                s.get_one(Attempt, 1).started_at = now - elapsed
                s.commit()
            fired.append([a.key.rsplit(":", 1)[-1] for a in engine.evaluate(now)])
        drain(worker)
        messages = [p.json["message"] for p in receiver.posts]
        tick_until(scheduler, lambda: status(sessions, run_id) == "PAUSED")
    assert fired == [[], ["50"], [], ["80"], ["100"]]
    assert len(messages) == 3 and "100% of its $1.00 budget; runyard pauses it" in messages[2]


def test_stalled_and_gpu_idle_fire_from_what_the_database_holds(sessions: sessionmaker[Session],
                                                                settings: Settings) -> None:
    # No GPU here: the system monitor's rows for one are written as it would write them.
    run_id, scheduler = running_attempt(sessions, settings, alerts={"gpu_idle_s": 120, "stalled_min_s": 60})
    engine, _ = engine_and_worker(sessions, settings)
    now = time.time()
    with sessions() as s:
        run, attempt = s.get_one(Run, run_id), s.get_one(Attempt, 1)
        run.status = "RUNNING"
        attempt.started_at, attempt.first_step_at, attempt.progress_at = now - 900, now - 800, now - 300
        attempt.last_step = 70
        s.add_all(SystemMetric(at=now - 130 + 10 * i, host="h", device="gpu0", run_id=run_id, key="util_percent",
                               min=0, mean=1, max=2, count=5) for i in range(14))
        s.commit()
    found = {a.trigger: a.message for a in engine.evaluate()}
    assert set(found) == {"stalled", "gpu_idle"}
    assert "no new step for 5 min after step 70" in found["stalled"]
    assert "gpu0, all under 5% utilisation" in found["gpu_idle"]
    with sessions() as s:
        s.get_one(Attempt, 1).progress_at = time.time()
        s.add(SystemMetric(at=time.time(), host="h", device="gpu0", run_id=run_id, key="util_percent",
                           min=80, mean=90, max=99, count=5))
        s.commit()
    engine.evaluate()
    with sessions() as s:
        states = dict(s.execute(select(Alert.trigger, Alert.state)).all())
    assert states == {"stalled": "resolved", "gpu_idle": "resolved"}
    cancel(sessions, scheduler, run_id)


def test_a_hang_alert_carries_the_hung_ranks_top_frames(sessions: sessionmaker[Session], settings: Settings) -> None:
    text = ('Current thread 0x01 (most recent call first):\n  File "/x/trainer/data.py", line 12 in next_batch\n'
            '  File "/x/trainer/loop.py", line 80 in train_step\n  File "/x/trainer/loop.py", line 20 in main\n')
    dump = StackDump(folder=Path("/tmp"), files=[], ranks=[
        RankStack(rank=0, pid=1, stopped=False, text='File "/t/torch/distributed/c10d.py", line 1 in all_reduce'),
        RankStack(rank=1, pid=2, stopped=True, text=text)])
    rank, _ = dump.culprit()
    frames = top_frames_of(dump, rank)
    assert frames == "; top of rank 1's stack: next_batch at data.py:12 < train_step at loop.py:80 < main at loop.py:20"
    run_id, scheduler = running_attempt(sessions, settings)
    engine, _ = engine_and_worker(sessions, settings)
    now = time.time()
    with sessions() as s:
        attempt = s.get_one(Attempt, 1)
        attempt.hang_detected_at, attempt.progress_at, attempt.failed_rank = now, now - 400, 1
        s.add(Event(run_id=run_id, attempt=1, at=now, kind="stacks", message=f"stacks saved in x{frames}"))
        s.commit()
    (alert,) = engine.evaluate()
    assert alert.trigger == "hang"
    assert "no progress for 6.7 min" in alert.message or "no progress for 7 min" in alert.message
    assert "rank 1 hung; top of its stack: next_batch at data.py:12 < train_step at loop.py:80" in alert.message
    cancel(sessions, scheduler, run_id)


def test_finished_is_off_by_default_and_says_the_final_metrics_when_on(sessions: sessionmaker[Session],
                                                                       settings: Settings) -> None:
    quiet = queue(sessions, settings, "quick")
    told = queue(sessions, settings, "quick", alerts={"on": ["finished"]})
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, quiet) == status(sessions, told) == "SUCCEEDED")
    with sessions() as s:
        write_points(s.connection(), [dict(run_id=told, attempt=1, rank=0, step=300, key="loss", value=0.125,
                                           wall_time=time.time())])
        s.commit()
    engine, _ = engine_and_worker(sessions, settings)
    (alert,) = engine.evaluate()
    assert (alert.run_id, alert.trigger, alert.state) == (told, "finished", "closed")
    assert f"run {told} (quick) SUCCEEDED after" in alert.message and "1 attempt(s)" in alert.message
    assert "final loss 0.125" in alert.message
    assert engine.evaluate() == []


def test_the_scheduler_coming_back_is_told_when_that_trigger_is_on(sessions: sessionmaker[Session],
                                                                   settings: Settings) -> None:
    AlertStore(settings.home).set_defaults(triggers=["failed", "scheduler"])
    now = time.time()
    with sessions() as s:
        s.add(SchedulerHeartbeat(host="node-a", pid=1, started_at=now - 7200, beat_at=now - 1800, home="/h"))
        me = SchedulerHeartbeat(host="node-a", pid=2, started_at=now, beat_at=now, home="/h")
        s.add(me)
        s.commit()
        me_id = me.id
    queue(sessions, settings, "long")
    engine = AlertEngine(sessions, settings.home, identity=lambda: me_id, host="node-a", started_at=now)
    (alert,) = engine.evaluate()
    assert alert.trigger == "scheduler" and alert.run_id is None
    assert "scheduler on node-a is back after 30 min down" in alert.message
    assert "0 active run(s) re-adopted or settled, 1 queued" in alert.message
    assert engine.evaluate() == []


def test_eta_slip_fires_when_the_pace_falls_behind_the_first_steady_eta(sessions: sessionmaker[Session],
                                                                        settings: Settings) -> None:
    run_id, scheduler = running_attempt(sessions, settings, alerts={"on": ["eta_slip"], "eta_slip_ratio": 0.25})
    engine, _ = engine_and_worker(sessions, settings)
    now = time.time()
    start = now - 200
    with sessions() as s:
        run = s.get_one(Run, run_id)
        run.status, run.started_at, run.max_steps = "RUNNING", start, 2000
        # 10 steps a second for the first 60 points (steps 10..600, 60 s): 2000 steps planned in ~200 s.
        points = [(step, start + step / 10) for step in range(10, 610, 10)]
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=st, key="loss", value=1.0,
                                           wall_time=t) for st, t in points])
        s.commit()
    assert engine.evaluate(start + 61) == []  # on pace
    with sessions() as s:
        # Then 1 step a second: 1390 steps left at that pace end far later than planned.
        slow = [(step, start + 60 + (step - 600)) for step in range(610, 660, 10)]
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=st, key="loss", value=1.0,
                                           wall_time=t) for st, t in slow])
        s.commit()
    (alert,) = engine.evaluate(start + 110)
    assert alert.trigger == "eta_slip" and "later than its first steady ETA" in alert.message
    cancel(sessions, scheduler, run_id)


def test_the_days_budget_counts_every_run_since_midnight(sessions: sessionmaker[Session], settings: Settings) -> None:
    AlertStore(settings.home).set_defaults(day_budget_usd=10.0)
    run_id, scheduler = running_attempt(sessions, settings)
    engine, _ = engine_and_worker(sessions, settings)
    midnight = time.mktime((*time.localtime()[:3], 0, 0, 0, 0, 0, -1))
    at = midnight + 3600  # judged at 01:00 today: the attempt's 9 s so far, all of them today
    with sessions() as s:
        s.get_one(Run, run_id).price_usd_per_hour = 3600.0  # $1 a second
        s.get_one(Attempt, 1).started_at = at - 9
        s.commit()
    day = time.strftime("%Y-%m-%d", time.localtime(at))
    assert sorted(a.key for a in engine.evaluate(at)) == [f"day:{day}:budget:50", f"day:{day}:budget:80"]
    (last,) = engine.evaluate(at + 2)  # 11 s
    assert last.key == f"day:{day}:budget:100" and "cost $11.00 today" in last.message
    cancel(sessions, scheduler, run_id)


def test_a_retry_s_alert_names_the_checkpoint_the_scheduler_resumes_from(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    """A built-in run's retry starts from runyard's own newest checkpoint; its alert said "from the
    start (no checkpoint)" because it looked at a script's versions only."""
    run_id = queue(sessions, settings, "fails", retry={"max_retries": 3, "backoff_s": 600, "backoff_max_s": 600})
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, run_id) == "RETRYING")
    with sessions() as s:
        run = s.get_one(Run, run_id)
        assert run is not None
        folder = Path(run.run_dir) / "checkpoints" / "step-100"
        s.add(Checkpoint(run_id=run_id, attempt=1, path=str(folder / "state.pt"), step=100, bytes=1, sha256="0" * 64,
                         params_digest="", metrics_json="{}", blocked_s=0.0, total_s=0.0, created_at=time.time(),
                         verified=True, pinned=False, deleted=False))
        s.commit()
        assert resume_point(s, run, 2) == (str(folder), 100)  # what the scheduler will launch from
        evaluator = Evaluator(s, time.time(), time.time() - 60, lambda r: rules_for(parse_config({}), ("retrying",)))
        (finding,) = evaluator.retrying()
    assert finding.message.endswith("from the checkpoint of step 100"), finding.message
