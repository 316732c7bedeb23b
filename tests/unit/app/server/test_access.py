"""The UI's access rules (app/server/access.py, orchestrator/ui_access.py): the token file, the session cookie, Host and
Origin. The same rules are tried end to end against the real `runyard up` in
tests/integration/test_ui_access.py."""

from __future__ import annotations

import asyncio
import hmac
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from app.server import access
from app.server.access import (
    SESSION_MAX_AGE_S,
    AccessPolicy,
    FailedLogins,
    session_valid,
    sign_session,
    split_host,
)
from app.server.gate import Gate
from app.server.prometheus import MetricsRoute
from orchestrator.ui_access import (
    AccessError,
    TokenSource,
    check_bind,
    ensure_token,
    is_loopback,
    login_url,
    new_token,
    parse_allowed_hosts,
    rotate_token,
)


def test_the_token_is_created_once_private_and_32_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    with ThreadPoolExecutor(8) as pool:
        tokens = set(pool.map(lambda _: ensure_token(path), range(16)))
    assert len(tokens) == 1  # processes starting together agree on one token
    token = tokens.pop()
    assert len(token) == 43 and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_token(tmp_path / "other") != token


def test_a_token_file_readable_by_others_is_narrowed(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("x" * 43 + "\n")
    os.chmod(path, 0o644)
    assert ensure_token(path) == "x" * 43
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_rotation_replaces_the_token_and_a_running_ui_sees_it(tmp_path: Path) -> None:
    path = tmp_path / "token"
    first = ensure_token(path)
    source = TokenSource(path)
    assert source.current() == first
    second = rotate_token(path)
    assert second != first and source.current() == second
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.unlink()
    assert source.current() is None  # no file: nothing is accepted


def test_a_session_cookie_is_bound_to_the_token_and_expires() -> None:
    token, other = "t" * 43, "u" * 43
    cookie = sign_session(token, issued=1_000_000)
    assert session_valid(token, cookie, now=1_000_000 + 10)
    assert not session_valid(other, cookie, now=1_000_010)  # a rotated token ends it
    assert not session_valid(token, cookie, now=1_000_000 + SESSION_MAX_AGE_S + 1)
    assert not session_valid(token, cookie, now=1_000_000 - 3600)  # issued in the future
    value, _, mac = cookie.split(".")
    later = sign_session(token, issued=1_000_001).split(".")[1]
    assert not session_valid(token, f"{value}.{later}.{mac}", now=1_000_010)  # its time altered
    assert session_valid(token, sign_session(token, issued=1_000_030), now=1_000_000)  # a clock stepped back
    for bad in ("", ".", "abc", "1.", "99999999999999.x", None):
        assert not session_valid(token, bad, now=1_000_010)
    assert not session_valid(None, cookie, now=1_000_010)


@pytest.mark.parametrize(("header", "parsed"), [
    ("127.0.0.1:8501", ("127.0.0.1", 8501)),
    ("LOCALHOST.", ("localhost", None)),
    ("[::1]:8501", ("::1", 8501)),
    ("[::1]", ("::1", None)),
    ("::1", None),
    ("a.example:99999", None),
    ("a.example:x", None),
    ("user@a.example", None),
    ("a.example/path", None),
    ("", None),
])
def test_host_headers_are_parsed_strictly(header: str, parsed: tuple[str, int | None] | None) -> None:
    assert split_host(header) == parsed


def test_host_and_origin_rules() -> None:
    policy = AccessPolicy(mode="token", port=8501, allowed_hosts=parse_allowed_hosts(["ws.lan"]))
    assert policy.check_host("127.0.0.1:8501").allowed
    assert policy.check_host("[::1]:8501").allowed
    assert policy.check_host("ws.lan:8501").allowed
    refused = policy.check_host("rebind.example:8501")
    assert not refused.allowed and refused.status == 403 and "--allowed-host" in refused.reason
    assert not policy.check_host(None).allowed
    assert policy.check_origin(None, "127.0.0.1:8501").allowed  # a program, not a page
    assert policy.check_origin("http://127.0.0.1:8501", "127.0.0.1:8501").allowed
    assert not policy.check_origin("http://localhost:8501", "127.0.0.1:8501").allowed
    assert not policy.check_origin("http://127.0.0.1:3000", "127.0.0.1:8501").allowed
    assert not policy.check_origin("null", "127.0.0.1:8501").allowed
    assert not policy.check_origin("file://", "127.0.0.1:8501").allowed
    assert not policy.check_origin("http://rebind.example:8501", "rebind.example:8501").allowed
    # Behind a TLS proxy the Host has no port: the origin's default port stands for it.
    assert policy.check_origin("https://ws.lan", "ws.lan").allowed


def test_binds_and_modes() -> None:
    assert check_bind("127.0.0.1", "none", None) is None
    assert check_bind("::1", "none", None) is None
    assert "--no-auth is refused" in (check_bind("0.0.0.0", "none", None) or "")
    assert check_bind("0.0.0.0", "token", None) is None
    assert "RUNYARD_PROXY_SECRET" in (check_bind("127.0.0.1", "proxy", None) or "")
    assert "at least 16" in (check_bind("127.0.0.1", "proxy", "short") or "")
    assert check_bind("0.0.0.0", "proxy", "x" * 32) is None
    assert is_loopback("127.0.0.2") and is_loopback("localhost") and not is_loopback("0.0.0.0")
    assert login_url("0.0.0.0", 8501, "T") == "http://127.0.0.1:8501/?token=T"
    assert login_url("::1", 8502, "T") == "http://[::1]:8502/?token=T"
    with pytest.raises(AccessError, match="not a host name"):
        parse_allowed_hosts(["https://ws.lan"])
    assert parse_allowed_hosts(["A.lan, b.lan", "", "[fe80::1]"]) == {"a.lan", "b.lan", "fe80::1"}


def test_gate_corners_empty_host_foreign_port_and_wrong_scheme_are_refused() -> None:
    """Issue 25 item 3: these three passed before."""
    policy = AccessPolicy(mode="token", port=8501, allowed_hosts=parse_allowed_hosts(["ws.lan"]))
    assert not policy.check_host("").allowed
    assert not policy.check_host("[::1]:1").allowed
    assert not policy.check_host("127.0.0.1:8502").allowed
    assert policy.check_host("localhost").allowed  # no port: the default stands
    assert not policy.check_origin("https://127.0.0.1:8501", "127.0.0.1:8501", "http").allowed
    assert policy.check_origin("http://127.0.0.1:8501", "127.0.0.1:8501", "http").allowed
    assert policy.check_origin("https://ws.lan", "ws.lan", "http").allowed  # TLS proxy in front


def test_wrong_tokens_lock_out_their_client_for_the_window_and_no_one_else() -> None:
    now = [1000.0]
    limit = FailedLogins(allowed=3, window_s=60, clock=lambda: now[0])
    for _ in range(3):
        assert limit.blocked_for("10.0.0.9") == 0
        limit.failed("10.0.0.9")
    assert limit.blocked_for("10.0.0.9") == pytest.approx(60)
    assert limit.blocked_for("127.0.0.1") == 0  # another client is not held up
    now[0] += 59
    assert limit.blocked_for("10.0.0.9") == pytest.approx(1)
    now[0] += 2
    assert limit.blocked_for("10.0.0.9") == 0  # the oldest failure left the window
    assert limit._failures == {}  # nothing kept for a client without recent failures


def test_tokens_and_sessions_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[object, object]] = []
    real = hmac.compare_digest

    def spy(a: object, b: object) -> bool:
        calls.append((a, b))
        return real(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(access.hmac, "compare_digest", spy)
    token = new_token()
    assert access.token_matches(token, token) and not access.token_matches(token, "x" * len(token))
    assert access.session_valid(token, access.sign_session(token))
    assert len(calls) >= 3  # every comparison went through hmac.compare_digest


def _status(app: Any, path: str, query: str = "", headers: dict[str, str] | None = None) -> int:
    """The status ``app`` (an ASGI app) answers one GET from 127.0.0.1 with, as the server would."""
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": query.encode(), "scheme": "http", "client": ("127.0.0.1", 40000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in {"Host": "127.0.0.1:8501",
                                                                        **(headers or {})}.items()]}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))


async def _streamlit(scope: Any, receive: Any, send: Any) -> None:
    """Stands in for Streamlit behind the gate: 200 to whatever reaches it."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_wrong_guesses_from_this_machine_never_lock_out_the_right_token_nor_the_scraper(tmp_path: Path) -> None:
    """Every local account is 127.0.0.1: its 12 wrong tokens are refused, then slowed (429), but the
    owner's right token (in the URL or a header) still gets in at once; the same for /metrics'
    scrape token. Before, the right token got 429 for the rest of the minute."""
    token, scrape = ensure_token(tmp_path / "token"), ensure_token(tmp_path / "scrape_token")
    policy = AccessPolicy(mode="token", port=8501, token=TokenSource(tmp_path / "token"))
    app = MetricsRoute(Gate(_streamlit, policy), policy, TokenSource(tmp_path / "scrape_token"), CollectorRegistry())
    guesses = [_status(app, "/", f"token={new_token()}") for _ in range(12)]
    assert guesses == [403] * 10 + [429] * 2
    assert _status(app, "/", f"token={token}") == 303  # logged in: the cookie, then the page
    assert _status(app, "/_stcore/health", headers={"Authorization": f"token {token}"}) == 200
    assert _status(app, "/_stcore/health", headers={"Authorization": f"token {new_token()}"}) == 429
    scrapes = [_status(app, "/metrics", headers={"Authorization": f"Bearer {new_token()}"}) for _ in range(12)]
    assert scrapes == [401] * 10 + [429] * 2
    assert _status(app, "/metrics", headers={"Authorization": f"Bearer {scrape}"}) == 200
