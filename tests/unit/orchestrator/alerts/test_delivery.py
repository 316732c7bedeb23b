"""Alerts, delivered for real to local receivers: the scheduler's loop drives real (fake-command)
runs as in test_scheduler.py, the alert engine reads the database, and the delivery worker sends
to an HTTP server (Apprise ``json://`` and runyard's signed webhook) and an SMTP server.

The real torchrun path (a hung rank's stack in its alert) is in tests/integration/test_alerts.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.metricstore import write_points
from db.models import Alert, AlertDelivery, Attempt, Checkpoint, Event, Run, SchedulerHeartbeat, SystemMetric
from db.requests import request_cancel
from db.vocabulary.config import ConfigError, parse_config
from db.vocabulary.settings import Settings
from orchestrator.alerts import AlertsError
from orchestrator.alerts.channels import DeliveryError, Note, resolve, send, send_signed
from orchestrator.alerts.delivery import DeliveryWorker
from orchestrator.alerts.engine import AlertEngine, history, in_quiet_hours, open_alert_runs, send_test
from orchestrator.alerts.engine import queue as queue_delivery
from orchestrator.alerts.findings import rules_for
from orchestrator.alerts.store import AlertStore, Channel, mask_url
from orchestrator.alerts.triggers import Evaluator
from orchestrator.cli.group import cli
from orchestrator.executors.stack_reading import RankStack
from orchestrator.executors.stacks import StackDump
from orchestrator.scheduler.alert_job import add_alert_jobs
from orchestrator.scheduler.attempts import resume_point
from orchestrator.scheduler.watchdog import top_frames_of
from tests.alert_receivers import http_receiver, smtp_receiver
from tests.unit.test_scheduler import make_scheduler, queue, status, tick_until


def engine_and_worker(sessions: sessionmaker[Session], settings: Settings,
                      backoff_s: tuple[float, ...] = (0.1, 0.1)) -> tuple[AlertEngine, DeliveryWorker]:
    engine = AlertEngine(sessions, settings.home)
    worker = DeliveryWorker(sessions, AlertStore(settings.home), payloads=engine.payload, backoff_s=backoff_s)
    return engine, worker


def deliveries(sessions: sessionmaker[Session]) -> list[AlertDelivery]:
    with sessions() as s:
        return list(s.scalars(select(AlertDelivery).order_by(AlertDelivery.id)))


def drain(worker: DeliveryWorker, timeout: float = 15.0) -> None:
    """Send until nothing is pending (tries that fail wait out the short test backoff)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.run_due() >= 30.0:
            return
        time.sleep(0.05)
    raise AssertionError("deliveries still pending")


def running_attempt(sessions: sessionmaker[Session], settings: Settings, name: str = "long",
                    **sections: dict) -> tuple[int, object]:
    run_id = queue(sessions, settings, name, **sections)
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, run_id) == "STARTING")
    return run_id, scheduler


def cancel(sessions: sessionmaker[Session], scheduler: object, run_id: int) -> None:
    with sessions() as s:
        request_cancel(s, run_id)
        s.commit()
    tick_until(scheduler, lambda: status(sessions, run_id) in ("CANCELLED", "PAUSED"))  # type: ignore[arg-type]


def test_a_run_retried_three_times_sends_one_message_per_attempt_to_both_kinds_of_channel(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    store = AlertStore(settings.home)
    with http_receiver() as receiver:
        store.add(receiver.url("json", "/apprise"))
        signed = store.add(receiver.url("runyard+http", "/hook"))
        run_id = queue(sessions, settings, "fails", retry={"max_retries": 3, "backoff_s": 0.2, "backoff_max_s": 0.5})
        scheduler = make_scheduler(sessions, settings)
        engine, worker = engine_and_worker(sessions, settings)
        passes = 0

        def ended() -> bool:
            nonlocal passes
            passes += 1
            if passes % 7 == 0:  # the job runs beside the tick, far less often
                engine.evaluate()
            return status(sessions, run_id) == "FAILED"

        tick_until(scheduler, ended, timeout=40)
        engine.evaluate()
        engine.evaluate()  # nothing new: no message twice
        drain(worker)
        apprise_posts, hook_posts = receiver.on("/apprise"), receiver.on("/hook")

    # 3 retries and the failure, to each channel: exactly 4 messages each.
    assert len(apprise_posts) == 4 and len(hook_posts) == 4
    triggers = [p.json["trigger"] for p in hook_posts]
    assert sorted(triggers) == ["failed", "retrying", "retrying", "retrying"]
    for post in hook_posts:  # signed with the channel's secret, over the exact body
        expected = "sha256=" + hmac.new(signed.secret.encode(), post.body, hashlib.sha256).hexdigest()
        assert post.headers["X-Runyard-Signature"] == expected
        assert post.json["run"]["id"] == run_id and post.json["link"].endswith(f"/run?run={run_id}")
    failed = next(p.json for p in hook_posts if p.json["trigger"] == "failed")
    assert f"run {run_id} (fails) failed" in failed["message"] and "retries used 3 of 3" in failed["message"]
    retry_lines = sorted(p.json["message"] for p in hook_posts if p.json["trigger"] == "retrying")
    assert [f"retry {n} of 3" in line for n, line in zip((1, 2, 3), retry_lines, strict=True)] == [True] * 3
    assert all(p.json["message"] in {p.json["message"] for p in hook_posts} for p in hook_posts)
    assert any(f"run {run_id} (fails)" in p.json["message"] for p in apprise_posts)
    assert {d.status for d in deliveries(sessions)} == {"delivered"}
    with sessions() as s:
        (failed_alert,) = s.scalars(select(Alert).where(Alert.trigger == "failed")).all()
        assert failed_alert.state == "open"  # the run stays FAILED
    with sessions() as s:
        assert open_alert_runs(s) == {run_id: ["failed"]}


def test_a_channel_that_is_down_is_retried_recorded_and_never_slows_the_tick(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    store = AlertStore(settings.home)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    with http_receiver(delay_s=5.0) as slow:
        down = store.add(f"json://127.0.0.1:{dead_port}/down")
        store.add(slow.url("runyard+http", "/slow"))
        run_id = queue(sessions, settings, "fails", retry={"max_retries": 0})
        other = queue(sessions, settings, "long")
        scheduler = make_scheduler(sessions, settings)
        tick_until(scheduler, lambda: status(sessions, run_id) == "FAILED")
        engine, worker = engine_and_worker(sessions, settings, backoff_s=(0.2, 0.2))
        engine.evaluate()
        worker.start()
        durations = []
        started = time.monotonic()
        while time.monotonic() - started < 5.5:  # while the worker waits on the slow and the dead channel
            t0 = time.monotonic()
            scheduler.tick()
            durations.append(time.monotonic() - t0)
            time.sleep(0.05)
        deadline = time.monotonic() + 15
        while any(d.status == "pending" for d in deliveries(sessions)) and time.monotonic() < deadline:
            time.sleep(0.1)
        worker.close()
        cancel(sessions, scheduler, other)
    rows = {d.channel_id: d for d in deliveries(sessions)}
    assert rows[down.id].status == "failed" and rows[down.id].tries == 3
    assert "Connection error" in (rows[down.id].error or "")
    assert rows[down.id + 1].status == "delivered"
    # A tick that waited for the delivery would take most of its 5 s.
    assert max(durations) < 2.0, f"a tick took {max(durations):.2f} s while a delivery hung for 5 s"
    assert len(durations) > 20


def test_an_email_through_apprise_reaches_a_local_smtp_server(sessions: sessionmaker[Session],
                                                               settings: Settings) -> None:
    with smtp_receiver() as (port, messages):
        AlertStore(settings.home).add(f"mailto://127.0.0.1:{port}?from=runyard@example.com&to=me@example.com"
                                      "&mode=insecure")
        (row,) = send_test(sessions, settings.home)
    assert row.status == "delivered" and row.kind == "test"
    assert len(messages) == 1 and messages[0].rcpt_tos == ["me@example.com"]
    assert b"runyard test message" in messages[0].content


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
            s.get(Attempt, 1).last_step = 40  # type: ignore[union-attr]
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
                s.get(Run, run_id).price_usd_per_hour = 3600.0  # type: ignore[union-attr]
                s.get(Attempt, 1).started_at = now - elapsed  # type: ignore[union-attr]
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
        run, attempt = s.get(Run, run_id), s.get(Attempt, 1)
        run.status = "RUNNING"  # type: ignore[union-attr]
        attempt.started_at, attempt.first_step_at, attempt.progress_at = now - 900, now - 800, now - 300  # type: ignore
        attempt.last_step = 70  # type: ignore[union-attr]
        s.add_all(SystemMetric(at=now - 130 + 10 * i, host="h", device="gpu0", run_id=run_id, key="util_percent",
                               min=0, mean=1, max=2, count=5) for i in range(14))
        s.commit()
    found = {a.trigger: a.message for a in engine.evaluate()}
    assert set(found) == {"stalled", "gpu_idle"}
    assert "no new step for 5 min after step 70" in found["stalled"]
    assert "gpu0, all under 5% utilisation" in found["gpu_idle"]
    with sessions() as s:
        s.get(Attempt, 1).progress_at = time.time()  # type: ignore[union-attr]
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
        attempt = s.get(Attempt, 1)
        attempt.hang_detected_at, attempt.progress_at, attempt.failed_rank = now, now - 400, 1  # type: ignore
        s.add(Event(run_id=run_id, attempt=1, at=now, kind="stacks", message=f"stacks saved in x{frames}"))
        s.commit()
    (alert,) = engine.evaluate()
    assert alert.trigger == "hang"
    assert "no progress for 6.7 min" in alert.message or "no progress for 7 min" in alert.message
    assert "rank 1 hung; top of its stack: next_batch at data.py:12 < train_step at loop.py:80" in alert.message
    cancel(sessions, scheduler, run_id)


def test_a_still_true_alert_repeats_after_the_interval_and_quiet_hours_defer(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    store = AlertStore(settings.home)
    store.add("json://127.0.0.1:9/never")
    run_id, scheduler = running_attempt(sessions, settings, alerts={"repeat_s": 600, "stalled_min_s": 60})
    engine, _ = engine_and_worker(sessions, settings)
    now = time.time()
    with sessions() as s:
        run, attempt = s.get(Run, run_id), s.get(Attempt, 1)
        run.status = "RUNNING"  # type: ignore[union-attr]
        attempt.first_step_at, attempt.progress_at = now - 400, now - 300  # type: ignore[union-attr]
        s.commit()
    assert [a.trigger for a in engine.evaluate(now)] == ["stalled"]
    assert engine.evaluate(now + 300) == []
    assert [a.repeats for a in engine.evaluate(now + 601)] == [1]
    kinds = [(d.kind, d.next_at) for d in deliveries(sessions)]
    assert [k for k, _ in kinds] == ["fire", "repeat"]
    cancel(sessions, scheduler, run_id)
    # Quiet hours: 23:00-07:00 holds 02:00 (until 07:00 that day), not 12:00; urgent triggers skip them.
    two_am = time.mktime((2026, 11, 27, 2, 0, 0, 0, 0, -1))
    assert in_quiet_hours("23:00-07:00", two_am) == time.mktime((2026, 11, 27, 7, 0, 0, 0, 0, -1))
    assert in_quiet_hours("23:00-07:00", two_am + 10 * 3600) is None
    assert in_quiet_hours("", two_am) is None


def test_run_config_alerts_are_validated_naming_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"alerts": {"on": ["finished", "nope"], "budget_usd": -1}})
    text = str(err.value)
    assert "alerts.on" in text and "'nope'" in text and "alerts.budget_usd" in text
    config = parse_config({"alerts": {"on": ["finished"], "off": ["gpu_idle"], "channels": ["2"]}})
    rules = rules_for(config, ("failed", "gpu_idle"))
    assert rules.triggers == {"failed", "finished"}


def test_channel_urls_are_kept_0600_and_shown_masked(settings: Settings) -> None:
    store = AlertStore(settings.home)
    channel = store.add("json://user:hunter22@hooks.example.com/T0KEN123/abc?token=zzsecret")
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert channel.masked == "json://user:***@hooks.example.com/***?token=***"
    assert mask_url("slack://TokenA1/TokenB2/TokenC3") == "slack://tok***/***"
    runner = CliRunner()
    listed = runner.invoke(cli, ["alerts", "ls"], env={"RUNYARD_HOME": str(settings.home)})
    assert listed.exit_code == 0 and "hooks.example.com" in listed.output
    assert "hunter22" not in listed.output and "T0KEN123" not in listed.output and "zzsecret" not in listed.output
    with pytest.raises(AlertsError, match="does not understand"):
        store.add("nosuchscheme://x")


def test_writers_of_the_channel_file_take_turns(settings: Settings) -> None:
    """Each writer reads, changes and replaces alerts.json under one exclusive lock (filelock, as
    the scheduler's and the migration's locks): writers at once lose no channel."""
    def add_some(n: int) -> None:
        store = AlertStore(settings.home)  # a store of its own, as each process has
        for i in range(5):
            store.add(f"json://hooks.example.com/writer{n}/{i}")

    threads = [threading.Thread(target=add_some, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    channels = AlertStore(settings.home).load().channels
    assert len(channels) == 20 and len({c.id for c in channels}) == 20
    lock = settings.home / ".alerts.json.lock"
    assert not lock.exists() or stat.S_IMODE(lock.stat().st_mode) == 0o600


def test_cli_add_test_history_and_rm(sessions: sessionmaker[Session], settings: Settings) -> None:
    env = {"RUNYARD_HOME": str(settings.home), "RUNYARD_DB_URL": settings.db_url}
    runner = CliRunner()
    with http_receiver() as receiver:
        added = runner.invoke(cli, ["alerts", "add", receiver.url("runyard+http", "/hook"), "--on", "failed"], env=env)
        assert added.exit_code == 0, added.output
        assert "channel 1 added: runyard+http://127.0.0.1:" in added.output and "signing secret" in added.output
        down = runner.invoke(cli, ["alerts", "add", "json://127.0.0.1:9/x"], env=env)
        assert down.exit_code == 0
        tested = runner.invoke(cli, ["alerts", "test"], env=env)
        assert len(receiver.posts) == 1
    assert tested.exit_code == 1
    assert "channel 1 runyard+http://127.0.0.1:" in tested.output and ": delivered" in tested.output
    assert "channel 2 json://127.0.0.1:9/***: failed" in tested.output and "1 of 2 channel(s) failed" in tested.output
    bad = runner.invoke(cli, ["alerts", "add", "json://x", "--on", "nope"], env=env)
    assert bad.exit_code == 2 and "nope" in bad.output
    assert runner.invoke(cli, ["alerts", "rm", "2"], env=env).exit_code == 0
    assert "json://127.0.0.1:9" not in runner.invoke(cli, ["alerts", "ls"], env=env).output
    run_id = queue(sessions, settings, "fails", retry={"max_retries": 0})
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, run_id) == "FAILED")
    engine, worker = engine_and_worker(sessions, settings)
    with http_receiver() as receiver:
        store = AlertStore(settings.home)
        channel = store.remove(1)
        store.add(receiver.url("runyard+http", "/hook"), on=channel.on)
        engine.evaluate()
        drain(worker)
    shown = runner.invoke(cli, ["alerts", "history", str(run_id), "--json"], env=env)
    assert shown.exit_code == 0
    (alert,) = json.loads(shown.output)
    assert alert["trigger"] == "failed" and alert["run_id"] == run_id
    assert [(d["kind"], d["status"]) for d in alert["deliveries"]] == [("fire", "delivered")]
    with sessions() as s:
        assert history(s, run_id)[0]["deliveries"][0]["channel"].startswith("runyard+http://127.0.0.1:")


def rebinding_dns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """DNS rebinding cannot be staged here without a resolver of our own: lookups of
    ``hooks.rebind.test`` are answered by a stand-in that gives 127.0.0.1 first and the metadata
    address after that (other names resolve as before). Returns the list of its lookups."""
    real = socket.getaddrinfo
    calls: list[str] = []

    def rebinding(host: str, port: object, *args: object, **kwargs: object) -> list:
        if host != "hooks.rebind.test":
            return real(host, port, *args, **kwargs)  # type: ignore[arg-type]
        calls.append(host)
        address = "127.0.0.1" if len(calls) == 1 else "169.254.169.254"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    return calls


def test_webhook_target_resolved_once_pinned_and_metadata_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DeliveryError, match="cloud metadata address"):
        resolve("169.254.169.254", 80)
    with pytest.raises(DeliveryError, match="link-local"):
        resolve("169.254.10.1", 80)
    with pytest.raises(DeliveryError, match="link-local"):
        resolve("fe80::1", 80)
    assert resolve("169.254.169.254", 80, allow=("169.254.169.254",)) == "169.254.169.254"
    calls = rebinding_dns(monkeypatch)
    with http_receiver() as receiver:
        url = f"runyard+http://hooks.rebind.test:{receiver.port}/hook"
        channel = Channel(id=1, url=url, secret="k")  # noqa: S106 - a test key
        send_signed(channel, Note("t", "b", {"run": None, "trigger": "test"}))
        assert len(receiver.posts) == 1 and receiver.posts[0].headers["Host"].startswith("hooks.rebind.test")
    assert calls == ["hooks.rebind.test"]  # resolved once; the connection went to that address
    with pytest.raises(DeliveryError, match="cloud metadata address"):
        send_signed(channel, Note("t", "b", {}))


def test_an_apprise_webhook_is_pinned_to_the_address_it_was_checked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apprise's generic webhooks (json://, form://, xml://) re-resolve the name in their own HTTP
    client, from a thread of Apprise's; the send pins it to the address the check saw."""
    real = socket.getaddrinfo
    calls = rebinding_dns(monkeypatch)
    with http_receiver() as receiver:
        channel = Channel(id=1, url=f"json://hooks.rebind.test:{receiver.port}/hook")
        send(channel, Note("title", "body", {}))
        assert len(receiver.posts) == 1 and receiver.posts[0].headers["Host"].startswith("hooks.rebind.test")
        assert receiver.posts[0].json["message"] == "body"
    assert calls == ["hooks.rebind.test"]  # resolved once, by the check; the send went to that address
    assert socket.getaddrinfo("localhost", 80) == real("localhost", 80)  # outside a send, lookups as before
    with pytest.raises(DeliveryError, match="cloud metadata address"):  # the next send's check sees the rebind
        send(channel, Note("title", "body", {}))


def test_the_alert_job_runs_beside_the_tick(sessions: sessionmaker[Session], settings: Settings) -> None:
    aps = BackgroundScheduler()
    scheduler = make_scheduler(sessions, settings)
    worker = add_alert_jobs(aps, scheduler)
    try:
        job = aps.get_job("alerts")
        assert job is not None and job.max_instances == 1 and job.coalesce
        assert any(t.name == "runyard-alerts" for t in threading.enumerate())
    finally:
        worker.close()
        scheduler.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


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
        run = s.get(Run, run_id)
        run.status, run.started_at, run.max_steps = "RUNNING", start, 2000  # type: ignore[union-attr]
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
        s.get(Run, run_id).price_usd_per_hour = 3600.0  # type: ignore[union-attr]  # $1 a second
        s.get(Attempt, 1).started_at = at - 9  # type: ignore[union-attr]
        s.commit()
    day = time.strftime("%Y-%m-%d", time.localtime(at))
    assert sorted(a.key for a in engine.evaluate(at)) == [f"day:{day}:budget:50", f"day:{day}:budget:80"]
    (last,) = engine.evaluate(at + 2)  # 11 s
    assert last.key == f"day:{day}:budget:100" and "cost $11.00 today" in last.message
    cancel(sessions, scheduler, run_id)


def test_two_workers_on_one_database_send_a_delivery_once(sessions: sessionmaker[Session],
                                                          settings: Settings) -> None:
    with http_receiver(delay_s=1.0) as receiver:
        channel = AlertStore(settings.home).add(receiver.url("runyard+http", "/hook"))
        with sessions() as s:
            (row,) = queue_delivery(s, None, [channel], "test", "test", "hello", None, time.time())
            s.commit()
            delivery_id = row.id
        workers = [engine_and_worker(sessions, settings)[1] for _ in range(2)]
        threads = [threading.Thread(target=w.run_due) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        time.sleep(0.5)
        posts = len(receiver.posts)
    assert posts == 1
    with sessions() as s:
        stored = s.get(AlertDelivery, delivery_id)
        assert stored is not None and (stored.status, stored.tries) == ("delivered", 1)


def test_a_retry_s_alert_names_the_checkpoint_the_scheduler_resumes_from(
        sessions: sessionmaker[Session], settings: Settings) -> None:
    """A built-in run's retry starts from runyard's own newest checkpoint; its alert said "from the
    start (no checkpoint)" because it looked at a script's versions only."""
    run_id = queue(sessions, settings, "fails", retry={"max_retries": 3, "backoff_s": 600, "backoff_max_s": 600})
    scheduler = make_scheduler(sessions, settings)
    tick_until(scheduler, lambda: status(sessions, run_id) == "RETRYING")
    with sessions() as s:
        run = s.get(Run, run_id)
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
