"""The UI's request rules (app/server/access.py): the session cookie, Host and Origin, the login
rate limit, and tokens compared in constant time. The same rules are tried end to end against the
real `runyard up` in tests/integration/test_ui_access.py.
"""

from __future__ import annotations

import hmac
from typing import Any

import pytest

from app.server import access
from app.server.access import SESSION_MAX_AGE_S, AccessPolicy, FailedLogins, session_valid, sign_session, split_host
from orchestrator.ui_access import new_token, parse_allowed_hosts


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

    def spy(a: Any, b: Any) -> bool:  # whatever the rules compare, handed on as it came
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    token = new_token()
    assert access.token_matches(token, token) and not access.token_matches(token, "x" * len(token))
    assert access.session_valid(token, access.sign_session(token))
    assert len(calls) >= 3  # every comparison went through hmac.compare_digest
