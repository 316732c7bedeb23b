"""Who may use the UI, tried against the real `runyard up` (the scheduler and the UI server with
its gate), as an attacker and as a person would: over raw HTTP and WebSocket handshakes.

The UI is a launcher (anyone who can use it runs programs as this user), so: no page, stream or
endpoint but the health check answers without the session cookie that the printed URL's token
buys; a Host the UI does not serve is refused even with the cookie (DNS rebinding); a page of
another origin is refused; a rotated token ends the old sessions; an open bind without auth never
starts.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import streamlit
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from app.server.access import sign_session

URL_LINE = re.compile(r"^http://127\.0\.0\.1:(\d+)/\?token=([A-Za-z0-9_-]{43})$", re.MULTILINE)
STARTUP_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class UI:
    """A running `runyard up` or `runyard ui`: where it listens, its data folder and its output."""

    proc: subprocess.Popen
    port: int
    home: Path
    log: Path
    env: dict[str, str]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def printed_url(self) -> str:
        match = URL_LINE.search(self.output())
        assert match, f"no login URL on a line of its own in:\n{self.output()}"
        return match.group(0)

    def request(self, path: str, headers: dict[str, str] | None = None, method: str = "GET",
                body: bytes | None = None) -> http.client.HTTPResponse:
        """One raw request; ``Host`` is ``127.0.0.1:PORT`` unless ``headers`` names another."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        all_headers = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        for key, value in all_headers.items():
            conn.putheader(key, value)
        conn.endheaders(body)
        response = conn.getresponse()
        response.read()
        conn.close()
        return response

    def log_in(self, url: str | None = None) -> str:
        """Open the login URL the way a browser does; returns the session cookie (``name=value``)."""
        path = (url or self.printed_url()).split(f":{self.port}", 1)[1]
        response = self.request(path)
        assert response.status == 303, response.status
        cookie = response.getheader("Set-Cookie") or ""
        return cookie.split(";", 1)[0]

    def websocket(self, headers: dict[str, str]) -> int:
        """The status of a WebSocket handshake on Streamlit's stream: 101 when accepted."""
        headers = dict(headers)
        host = headers.pop("Host", f"127.0.0.1:{self.port}")  # the client writes Host from the URI
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=15)
        try:
            with connect(f"ws://{host}/_stcore/stream", sock=sock, additional_headers=headers,
                         subprotocols=["streamlit"], open_timeout=15) as ws:  # type: ignore[list-item]
                assert ws.response is not None
                return ws.response.status_code
        except InvalidStatus as exc:
            return exc.response.status_code
        finally:
            sock.close()

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator", *args], env=self.env,
                              capture_output=True, text=True, timeout=60)


def _start(home: Path, log: Path, *args: str, env_extra: dict[str, str] | None = None) -> UI:
    port = _free_port()
    env = {**os.environ, "RUNYARD_HOME": str(home), "RUNYARD_CPU_SLOTS": "1", **(env_extra or {})}
    env.pop("RUNYARD_DB_URL", None)
    env.pop("RUNYARD_ALLOWED_HOSTS", None)
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args, "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    ui = UI(proc, port, home, log, env)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"runyard {args[0]} exited {proc.returncode}:\n{ui.output()}")
        try:
            if ui.request("/healthz").status == 200 and ("?token=" in ui.output() or "auth:" in ui.output()):
                return ui
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"runyard {args[0]} did not answer in {STARTUP_TIMEOUT_S:.0f} s:\n{ui.output()}")


def _stop(ui: UI) -> None:
    try:
        family = psutil.Process(ui.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    if ui.proc.poll() is None:
        ui.proc.send_signal(signal.SIGTERM)
        try:
            ui.proc.wait(30)
        except subprocess.TimeoutExpired:
            ui.proc.kill()
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UI]:
    base = tmp_path_factory.mktemp("up")
    ui = _start(base / "home", base / "up.log", "up")
    try:
        yield ui
    finally:
        _stop(ui)


def test_the_printed_url_logs_in_with_a_strict_httponly_cookie_and_leaves_the_address_bar(up: UI) -> None:
    url = up.printed_url()
    token = url.rsplit("=", 1)[1]
    token_file = up.home / "token"
    assert token_file.read_text().strip() == token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    response = up.request(url.split(f":{up.port}", 1)[1].replace("/?", "/run?run=7&"))
    assert response.status == 303
    assert response.getheader("Location") == "/run?run=7"  # the token is dropped, the rest kept
    cookie = response.getheader("Set-Cookie") or ""
    assert cookie.startswith(f"runyard-session-{up.port}=")
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
    assert token not in cookie
    page = up.request("/", {"Cookie": cookie.split(";", 1)[0]})
    assert page.status == 200
    assert up.cli("token").stdout.strip() == url  # `runyard token` prints the same URL again


def test_without_the_cookie_nothing_but_the_health_check_answers(up: UI) -> None:
    for path in ("/", "/run?run=1", "/_stcore/health", "/_stcore/host-config", "/static/js/index.js",
                 "/_stcore/metrics", "/media/x.png", "/favicon.png"):
        assert up.request(path).status == 401, path
    assert up.request("/_stcore/upload_file/s/f", method="PUT", body=b"x").status == 401
    assert up.request("/healthz").status == 200
    assert up.websocket({}) == 403
    assert up.websocket({"Origin": f"http://127.0.0.1:{up.port}"}) == 403
    page = up.request("/", {"Accept": "text/html"})
    assert page.status == 401


def health(up: UI) -> tuple[int, str, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", up.port, timeout=15)
    try:
        conn.request("GET", "/healthz", headers={"Host": f"127.0.0.1:{up.port}"})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", json.loads(response.read())
    finally:
        conn.close()


def test_healthz_answers_json_with_the_version_and_the_scheduler_without_login(up: UI) -> None:
    deadline = time.monotonic() + 60
    status, kind, body = health(up)
    while not body.get("scheduler_alive") and time.monotonic() < deadline:  # its first heartbeat
        time.sleep(0.5)
        status, kind, body = health(up)
    assert status == 200 and kind.startswith("application/json"), (status, kind)
    assert body["status"] == "ok" and body["scheduler_alive"] is True, body
    assert body["version"] == json.loads(up.cli("info", "--json").stdout)["version"]
    # Nothing else leaks to whoever asks without a login: no host, pid, path or run.
    assert set(body) <= {"status", "version", "scheduler_alive", "scheduler_heartbeat_age_s"}, body


def test_with_the_cookie_the_page_and_the_stream_answer(up: UI) -> None:
    cookie = up.log_in()
    assert up.request("/_stcore/health", {"Cookie": cookie}).status == 200
    assert up.websocket({"Cookie": cookie, "Origin": f"http://127.0.0.1:{up.port}"}) == 101
    assert up.websocket({"Cookie": cookie, "Origin": f"http://localhost:{up.port}",
                         "Host": f"localhost:{up.port}"}) == 101


def test_a_page_is_told_where_its_server_is_and_nothing_else_changes(up: UI) -> None:
    """Streamlit's page for every address gets a script at the top of its head that names its
    server (app/server/gate.py), so that a new tab on /run connects at once instead of after a 404 and a
    pause; the page's length is its new one, and scripts pass through untouched."""
    cookie = up.log_in()

    def get(path: str, accept: str) -> tuple[http.client.HTTPResponse, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", up.port, timeout=15)
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{up.port}", "Cookie": cookie, "Accept": accept,
                                           "Accept-Encoding": "gzip, deflate, br"})
        response = conn.getresponse()
        body = response.read()
        conn.close()
        return response, body

    page_accept = "text/html,application/xhtml+xml,*/*;q=0.8"
    response, body = get("/run?run=1", page_accept)
    assert response.status == 200 and response.getheader("Content-Encoding") is None
    assert int(response.getheader("Content-Length") or -1) == len(body)
    assert response.getheader("ETag") is None  # a cached copy is never one without the script
    script, rest = body.split(b"<head>", 1)[1].split(b"</script>", 1)
    assert script.startswith(b"<script>") and b'const seen="/run";' in script and b"BACKEND_BASE_URL" in script
    assert b'<script type="module"' in rest  # Streamlit's own page follows, whole
    # An address with markup in it cannot end the script early.
    _, body = get("/run%3C/script%3E%3Cscript%3Ealert(1)", page_accept)
    script = body.split(b"<head>", 1)[1].split(b"</script>", 1)[0]
    assert b"<" not in script[len(b"<script>"):] and b"\\u003c/script\\u003e" in script
    # Streamlit's script is served as Streamlit serves it.
    src = re.search(rb'src="\./(static/js/index\.[^"]+\.js)"', rest)
    assert src
    response, served = get(f"/{src.group(1).decode()}", "*/*")
    if response.getheader("Content-Encoding") == "gzip":
        served = gzip.decompress(served)
    on_disk = (Path(streamlit.__file__).parent / "static" / src.group(1).decode()).read_bytes()
    assert response.status == 200 and served == on_disk and response.getheader("ETag")


def test_a_foreign_host_is_refused_even_with_the_cookie(up: UI) -> None:
    cookie = up.log_in()
    rebound = f"rebind.example:{up.port}"
    # The DNS-rebinding handshake that Streamlit alone accepts: Host and Origin agree.
    assert up.websocket({"Cookie": cookie, "Host": rebound, "Origin": f"http://{rebound}"}) == 403
    for path in ("/", "/healthz", "/_stcore/health"):
        assert up.request(path, {"Cookie": cookie, "Host": rebound}).status == 403, path
    token = up.printed_url().rsplit("=", 1)[1]
    assert up.request(f"/?token={token}", {"Host": rebound}).status == 403  # no cookie handed out either


def test_a_page_of_another_origin_is_refused(up: UI) -> None:
    cookie = up.log_in()
    # localhost:3000 is the same *site* as localhost:PORT (cookies ignore ports), not the same origin.
    for origin in ("http://localhost:3000", "http://evil.example", "null", f"http://127.0.0.1:{up.port + 1}"):
        headers = {"Cookie": cookie, "Host": f"localhost:{up.port}", "Origin": origin}
        assert up.websocket(headers) == 403, origin
        assert up.request("/_stcore/health", headers).status == 403, origin


def test_gate_corners_are_refused_with_the_cookie(up: UI) -> None:
    """Issue 25 item 3: an empty Host, a loopback Host on a port the UI does not serve, an Origin
    of the wrong scheme and a cross-site fetch all passed the gate before."""
    cookie = up.log_in()
    assert up.request("/_stcore/health", {"Cookie": cookie}).status == 200  # the control
    for host in ("", "[::1]:1"):
        assert up.request("/_stcore/health", {"Cookie": cookie, "Host": host}).status == 403, host
    wrong_scheme = {"Cookie": cookie, "Origin": f"https://127.0.0.1:{up.port}"}
    assert up.websocket(wrong_scheme) == 403
    assert up.request("/_stcore/health", wrong_scheme).status == 403
    for method in ("GET", "POST", "HEAD", "OPTIONS"):
        response = up.request("/_stcore/health", {"Cookie": cookie, "Sec-Fetch-Site": "cross-site"}, method)
        assert response.status == 403, method
    assert up.websocket({"Cookie": cookie, "Origin": f"http://127.0.0.1:{up.port}",
                         "Sec-Fetch-Site": "cross-site"}) == 403
    assert up.request("/_stcore/health", {"Cookie": cookie, "Sec-Fetch-Site": "same-origin"}).status == 200


def test_wrong_tokens_are_rate_limited_but_the_right_token_and_a_logged_in_browser_are_not(tmp_path: Path) -> None:
    ui = _start(tmp_path / "home", tmp_path / "ui.log", "ui")
    try:
        cookie = ui.log_in()
        statuses = [ui.request("/?token=wrong").status for _ in range(12)]
        assert statuses[:10] == [403] * 10 and statuses[10:] == [429, 429], statuses
        # Any local account is 127.0.0.1: its guesses must not lock the owner out. The right token
        # still logs in (and works in a header), a wrong one still waits ...
        token = ui.printed_url().rsplit("=", 1)[1]
        assert ui.request(f"/?token={token}").status == 303
        assert ui.request("/_stcore/health", {"Authorization": f"token {token}"}).status == 200
        assert ui.request("/_stcore/health", {"Authorization": "token wrong"}).status == 429
        # ... and the browser that already holds its session is never locked out.
        assert ui.request("/_stcore/health", {"Cookie": cookie}).status == 200
    finally:
        _stop(ui)


def test_every_answer_carries_the_security_headers(up: UI) -> None:
    """Issue 25 item 2's defence in depth: Streamlit's own page and files, the gate's refusals."""
    cookie = up.log_in()
    for path, headers in (("/", {"Cookie": cookie}), ("/_stcore/health", {"Cookie": cookie}), ("/", {})):
        response = up.request(path, headers)
        csp = response.getheader("Content-Security-Policy") or ""
        assert "frame-ancestors 'none'" in csp, (path, csp)
        assert "default-src 'self'" in csp or "default-src 'none'" in csp, (path, csp)
        assert "img-src" not in csp or "http:" not in csp.split("img-src", 1)[1].split(";", 1)[0]
        assert response.getheader("X-Frame-Options") == "DENY", path
        assert response.getheader("Referrer-Policy") == "no-referrer", path
        assert response.getheader("X-Content-Type-Options") == "nosniff", path


def test_a_wrong_token_or_a_forged_cookie_is_refused(up: UI) -> None:
    wrong = up.request("/?token=" + "A" * 43)
    assert wrong.status == 403
    assert wrong.getheader("Set-Cookie") is None
    assert up.request("/", {"Authorization": "token " + "A" * 43}).status == 401
    good = up.log_in()
    name, value = good.split("=", 1)
    payload, issued, mac = value.split(".")  # itsdangerous' TimestampSigner: value.timestamp.signature
    later = sign_session("any-key", issued=int(time.time()) + 3600).split(".")[1]  # a timestamp, any key
    for forged in (f"{payload}.{later}.{mac}", f"{payload}.{issued}.{mac[:-2]}AA", "", "1.x"):
        assert up.request("/", {"Cookie": f"{name}={forged}"}).status == 401, forged
    # Another port's cookie is another UI's session.
    assert up.request("/", {"Cookie": f"runyard-session-{up.port + 1}={value}"}).status == 401


def test_the_token_in_an_authorization_header_works_for_programs(up: UI) -> None:
    token = up.printed_url().rsplit("=", 1)[1]
    assert up.request("/_stcore/health", {"Authorization": f"token {token}"}).status == 200
    assert up.request("/_stcore/health", {"Authorization": f"Bearer {token}"}).status == 200


def test_a_rotated_token_locks_out_the_old_cookie_and_the_old_url(up: UI) -> None:
    old_url = up.printed_url()
    old_cookie = up.log_in(old_url)
    assert up.request("/", {"Cookie": old_cookie}).status == 200
    rotated = up.cli("token", "--rotate")
    assert rotated.returncode == 0, rotated.stderr
    new_url = rotated.stdout.strip()
    assert URL_LINE.fullmatch(new_url) and new_url != old_url
    assert up.request("/", {"Cookie": old_cookie}).status == 401
    assert up.websocket({"Cookie": old_cookie}) == 403
    assert up.request(old_url.split(f":{up.port}", 1)[1]).status == 403
    new_cookie = up.log_in(new_url)
    assert up.request("/", {"Cookie": new_cookie}).status == 200


@pytest.mark.parametrize(("args", "says"), [
    (["up", "--host", "0.0.0.0", "--no-auth"], "--no-auth is refused with --host 0.0.0.0"),
    (["ui", "--host", "192.0.2.1", "--auth", "none"], "--no-auth is refused with --host 192.0.2.1"),
    (["up", "--auth", "proxy"], "RUNYARD_PROXY_SECRET"),
    (["ui", "--allowed-host", "http://x.example:80"], "is not a host name"),
])
def test_an_open_bind_without_auth_never_starts(tmp_path: Path, args: list[str], says: str) -> None:
    env = {**os.environ, "RUNYARD_HOME": str(tmp_path / "home")}
    env.pop("RUNYARD_PROXY_SECRET", None)
    port = _free_port()
    result = subprocess.run([sys.executable, "-m", "orchestrator", *args, "--port", str(port)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(port) in " ".join(p.info["cmdline"] or [])]


def test_a_named_host_is_served_when_allowed_and_the_loopback_ones_still_are(tmp_path: Path) -> None:
    ui = _start(tmp_path / "home", tmp_path / "ui.log", "ui", "--allowed-host", "Workstation.LAN.")
    try:
        cookie = ui.log_in()
        named = f"workstation.lan:{ui.port}"
        assert ui.request("/", {"Cookie": cookie, "Host": named}).status == 200
        assert ui.websocket({"Cookie": cookie, "Host": named, "Origin": f"http://{named}"}) == 101
        assert ui.request("/", {"Cookie": cookie, "Host": f"other.lan:{ui.port}"}).status == 403
        assert ui.request("/", {"Cookie": cookie, "Host": f"[::1]:{ui.port}"}).status == 200
    finally:
        _stop(ui)


def test_proxy_mode_trusts_only_requests_that_carry_the_secret_and_a_user(tmp_path: Path) -> None:
    secret = "s3cret-" + "x" * 24
    ui = _start(tmp_path / "home", tmp_path / "ui.log", "ui", "--auth", "proxy",
                env_extra={"RUNYARD_PROXY_SECRET": secret})
    try:
        assert "?token=" not in ui.output()
        assert ui.request("/").status == 401
        assert ui.request("/", {"X-Forwarded-User": "ada"}).status == 401
        assert ui.request("/", {"X-Forwarded-User": "ada", "X-Runyard-Proxy-Secret": "wrong" * 6}).status == 401
        assert ui.request("/", {"X-Runyard-Proxy-Secret": secret}).status == 401  # no user
        assert ui.request("/", {"X-Forwarded-User": "ada", "X-Runyard-Proxy-Secret": secret}).status == 200
        assert ui.websocket({"X-Forwarded-User": "ada", "X-Runyard-Proxy-Secret": secret}) == 101
    finally:
        _stop(ui)


def test_a_killed_runyard_up_leaves_no_ui_and_no_scheduler_behind(tmp_path: Path) -> None:
    ui = _start(tmp_path / "home", tmp_path / "up.log", "up")
    children = psutil.Process(ui.proc.pid).children(recursive=True)
    assert len(children) >= 2  # the scheduler and the UI server
    ui.proc.send_signal(signal.SIGKILL)
    ui.proc.wait(10)
    _gone, alive = psutil.wait_procs(children, timeout=20)
    try:
        assert not alive, [p.cmdline() for p in alive]
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", ui.port)) != 0  # the port is free again
    finally:
        for p in alive:
            p.kill()
