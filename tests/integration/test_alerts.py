"""Alerts from a real scheduler about real torchrun runs, delivered to receivers in this process:
runyard's signed webhook and an Apprise ``json://`` URL on a local HTTP server.

Two runs only (the rest is in tests/unit/orchestrator/alerts/, on fake commands): a run that fails
at once, and a rank stopped with SIGSTOP whose hang alert carries that rank's stack.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import signal
import time

import pytest

from tests.alert_receivers import http_receiver
from tests.integration.conftest import Product
from tests.integration.test_failures import rank_process

pytestmark = pytest.mark.slow


def add_channels(product: Product, port: int) -> str:
    """A signed webhook and an Apprise json:// channel; returns the webhook's secret."""
    added = product.cli("alerts", "add", f"runyard+http://127.0.0.1:{port}/hook").stdout
    product.cli("alerts", "add", f"json://127.0.0.1:{port}/apprise")
    match = re.search(r"secret \(.*\): ([0-9a-f]{64})", added)
    assert match, added
    return match[1]


def test_a_failed_run_is_told_to_both_channels_signed(product: Product) -> None:
    product.env["RUNYARD_FAULT_RAISE"] = "1"
    with http_receiver() as receiver:
        secret = add_channels(product, receiver.port)
        run_id = product.submit("retry.max_retries=2", "retry.backoff_s=0.5", "name=broken")
        product.start_scheduler()
        assert product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=120)["status"] == "FAILED"
        posts = receiver.wait_for(2, timeout=30)
        time.sleep(6)  # one more alert pass: nothing more is sent
        posts = list(receiver.posts)
    hook = [p for p in posts if p.path == "/hook"]
    assert len(hook) == 1 and len([p for p in posts if p.path == "/apprise"]) == 1
    body = hook[0].json
    assert hook[0].headers["X-Runyard-Signature"] == "sha256=" + hmac.new(
        secret.encode(), hook[0].body, hashlib.sha256).hexdigest()
    assert body["trigger"] == "failed" and body["run"] == {"id": run_id, "name": "broken", "status": "FAILED"}
    assert "USER_ERROR on rank" in body["message"] and "RuntimeError: injected failure at step 1" in body["message"]
    assert body["link"].endswith(f"/run?run={run_id}")
    history = product.cli("alerts", "history", str(run_id)).stdout
    assert "failed" in history and history.count(": delivered") == 2


def test_a_hung_rank_is_told_with_its_stack(product: Product) -> None:
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.02"
    with http_receiver() as receiver:
        add_channels(product, receiver.port)
        run_id = product.submit("train.max_steps=300", "checkpoint.every_steps=50", "supervision.hang_timeout_s=6",
                                "supervision.hang_step_factor=1", "retry.backoff_s=0.5", "name=hang",
                                "alerts.off=['stalled']")
        product.start_scheduler()
        product.wait_step(run_id, 120)
        rank_process(product, 1).send_signal(signal.SIGSTOP)
        detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=180)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len([p for p in receiver.on("/hook")]) < 2:
            time.sleep(0.2)
        hook = [p.json for p in receiver.on("/hook")]
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert sorted(p["trigger"] for p in hook) == ["hang", "retrying"], hook
    hang = next(p for p in hook if p["trigger"] == "hang")["message"]
    assert f"run {run_id} (hang) attempt 1 hung: no progress for" in hang
    frames = re.search(r"rank 1 hung; top of its stack: ([^;]+);", hang)
    assert frames, hang
    assert " at " in frames[1] and ".py:" in frames[1]
    assert "killed the attempt" in hang
