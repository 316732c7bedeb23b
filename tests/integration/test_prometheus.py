"""``GET /metrics`` on the real `runyard up` (the scheduler and the UI server with its gate),
scraped as Prometheus does (``Authorization: Bearer TOKEN``) and parsed with prometheus_client's
own parser.

The scrape token is its own credential: it is the only thing /metrics accepts (not the UI's
token, in any form, nor its session cookie), it opens nothing of the UI, and rotating it ends it
alone. A short run trained by the scheduler shows up with the numbers `runyard show` gives.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import EXAMPLE
from tests.integration.test_ui_access import UI, _start, _stop


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UI]:
    base = tmp_path_factory.mktemp("prometheus")
    ui = _start(base / "home", base / "up.log", "up")
    try:
        yield ui
    finally:
        _stop(ui)


def get(ui: UI, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of one GET; ``Host`` is ``127.0.0.1:PORT`` unless ``headers`` names another."""
    conn = http.client.HTTPConnection("127.0.0.1", ui.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{ui.port}", **(headers or {})})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
    finally:
        conn.close()


def scrape_token(ui: UI, *args: str) -> str:
    result = ui.cli("token", "--scrape", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def samples(body: str) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """Every sample of a scrape by name and labels, read with prometheus_client's parser."""
    out: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def test_metrics_answer_the_scrape_token_in_the_exposition_format(up: UI) -> None:
    token = scrape_token(up)
    assert (up.home / "scrape_token").stat().st_mode & 0o777 == 0o600
    status, headers, body = get(up, "/metrics", {"Authorization": f"Bearer {token}"})
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain; version="), headers
    assert headers["cache-control"] == "no-store"
    queue = samples(body)["runyard_queue_runs"]
    assert {dict(key)["state"] for key in queue} == {"QUEUED", "STARTING", "RUNNING", "RETRYING", "CANCELLING",
                                                     "PAUSING", "SUCCEEDED", "FAILED", "CANCELLED", "PAUSED",
                                                     "PRUNED"}  # a sweep's trial stopped early
    sweeps = samples(body)["runyard_sweeps"]
    assert {dict(key)["state"] for key in sweeps} == {"RUNNING", "PAUSED", "FINISHED", "STOPPED", "CANCELLED"}
    for family in ("# TYPE runyard_run_info gauge", "# TYPE runyard_run_restarts_total counter",
                   "# TYPE runyard_gpu_assigned_info gauge", "# TYPE runyard_alerts_firing gauge",
                   "# TYPE runyard_sweep_trials gauge", "# TYPE runyard_sweep_best gauge"):
        assert family in body, family


def test_without_the_scrape_token_metrics_are_refused_whatever_else_is_offered(up: UI) -> None:
    ui_token = up.printed_url().rsplit("=", 1)[1]
    cookie = up.log_in()
    assert get(up, "/_stcore/health", {"Cookie": cookie})[0] == 200  # the control: the cookie is good
    for headers in ({}, {"Cookie": cookie}, {"Authorization": f"Bearer {ui_token}"},
                    {"Authorization": f"token {ui_token}"}, {"Authorization": "Bearer " + "A" * 43},
                    {"Authorization": f"Basic {scrape_token(up)}"}):
        status, answer, body = get(up, "/metrics", headers)
        assert status == 401, (headers, status)
        assert answer.get("www-authenticate", "").startswith("Bearer"), answer
        assert "runyard_" not in body
    status, answer, _ = get(up, f"/metrics?token={ui_token}")  # no login through /metrics either
    assert status == 401 and "set-cookie" not in answer


def test_the_scrape_token_opens_nothing_of_the_ui(up: UI) -> None:
    token = scrape_token(up)
    for path in ("/", "/_stcore/health", "/run?run=1"):
        assert get(up, path, {"Authorization": f"Bearer {token}"})[0] == 401, path
    status, answer, _ = get(up, f"/?token={token}")
    assert status == 403 and "set-cookie" not in answer  # no session is handed out for it


def test_the_ui_host_rules_hold_for_metrics(up: UI) -> None:
    token = scrape_token(up)
    auth = {"Authorization": f"Bearer {token}"}
    assert get(up, "/metrics", {**auth, "Host": f"localhost:{up.port}"})[0] == 200
    assert get(up, "/metrics", {**auth, "Host": f"rebind.example:{up.port}"})[0] == 403
    assert get(up, "/metrics", {**auth, "Origin": "http://evil.example"})[0] == 403


def test_rotating_the_scrape_token_ends_it_alone(up: UI) -> None:
    old = scrape_token(up)
    cookie = up.log_in()
    new = scrape_token(up, "--rotate")
    assert new != old
    assert get(up, "/metrics", {"Authorization": f"Bearer {old}"})[0] == 401
    assert get(up, "/metrics", {"Authorization": f"Bearer {new}"})[0] == 200
    assert get(up, "/_stcore/health", {"Cookie": cookie})[0] == 200  # the UI's session lives on


def test_a_trained_run_shows_on_metrics_as_runyard_show_tells_it(up: UI) -> None:
    submitted = up.cli("submit", str(EXAMPLE), "--set", "launch.nproc_per_node=1", "--set", "train.max_steps=30",
                       "--set", "name=scraped")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    deadline = time.monotonic() + 240
    shown: dict = {}
    while time.monotonic() < deadline:
        shown = json.loads(up.cli("show", run_id, "--json").stdout)
        if shown["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(1.0)
    assert shown.get("status") == "SUCCEEDED", json.dumps(shown)[:2000]
    status, _, body = get(up, "/metrics", {"Authorization": f"Bearer {scrape_token(up)}"})
    assert status == 200
    got = samples(body)
    run = frozenset({("run_id", run_id)})
    assert got["runyard_run_info"][run | {("name", "scraped"), ("executor", "local")}] == 1
    assert got["runyard_run_state"][run | {("state", "SUCCEEDED")}] == 1
    assert got["runyard_run_state"][run | {("state", "RUNNING")}] == 0
    assert got["runyard_run_step"][run] == shown["step"] == 30
    assert got["runyard_run_eta_seconds"][run] == 0
    assert got["runyard_run_cost_dollars"][run] == pytest.approx(shown["cost_usd"])
    assert got["runyard_run_goodput_ratio"][run] == pytest.approx(shown["goodput"])
    last = got["runyard_run_last_step_timestamp_seconds"][run]
    assert shown["attempts"][-1]["first_step_at"] <= last <= shown["ended_at"]
    restarted = {dict(key)["run_id"] for key in got.get("runyard_run_restarts_total", {})}
    assert run_id not in restarted  # it never failed
    assert got["runyard_queue_runs"][frozenset({("state", "SUCCEEDED")})] >= 1


def test_the_server_refuses_a_bad_window_by_name(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="RUNYARD_METRICS_RECENT_S = 'soon'"):
        _start(tmp_path / "home", tmp_path / "ui.log", "ui", env_extra={"RUNYARD_METRICS_RECENT_S": "soon"})
