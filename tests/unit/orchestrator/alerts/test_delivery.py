"""Alerts delivered for real to local receivers (orchestrator/alerts/delivery.py): the scheduler's
loop drives real (fake-command) runs, the alert engine reads the database, and the delivery
worker sends to an HTTP server (Apprise ``json://`` and runyard's signed webhook) and an SMTP
server, once each, retried where a channel is down, never slowing the tick.

The real torchrun path (a hung rank's stack in its alert) is in tests/integration/test_alerts.py.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import sys
import threading
import time

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Alert, AlertDelivery
from db.vocabulary.settings import Settings
from orchestrator.alerts.engine import open_alert_runs, send_test
from orchestrator.alerts.engine import queue as queue_delivery
from orchestrator.alerts.store import AlertStore
from tests.alert_receivers import http_receiver, smtp_receiver
from tests.unit.orchestrator.alerts.alert_runs import cancel, deliveries, drain, engine_and_worker
from tests.unit.orchestrator.fake_runs import make_scheduler, queue, status, tick_until


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
    assert signed.secret is not None  # a runyard+http channel is given one
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


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
        stored = s.get_one(AlertDelivery, delivery_id)
        assert stored is not None and (stored.status, stored.tries) == ("delivered", 1)
