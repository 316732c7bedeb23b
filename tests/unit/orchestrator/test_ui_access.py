"""Reaching the UI (orchestrator/ui_access.py): the token file, created once, private and
rotated where a running UI sees it, and the bind rules the CLI shares with the UI server.
"""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.ui_access import (
    AccessError,
    TokenSource,
    check_bind,
    ensure_token,
    is_loopback,
    login_url,
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
