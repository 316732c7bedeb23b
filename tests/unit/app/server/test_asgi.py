"""The UI server's Streamlit options (app/server/asgi.py): only in proxy mode is the proxy's user
header mapped into ``st.user`` (where the Run page finds whose panel layout to show); in token
mode a browser's own header of that name is nobody's word."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import altair.utils.schemapi
import pytest
import streamlit as st
from streamlit.web import bootstrap

from app.server import asgi
from app.server.access import AccessPolicy
from db.vocabulary.settings import Settings


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The options each streamlit_app() loads, Streamlit's global config left as it was."""
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(bootstrap, "load_config_options", seen.append)
    monkeypatch.setattr(altair.utils.schemapi, "disable_debug_mode", lambda: None)
    monkeypatch.setattr(st, "App", lambda script: script)
    return seen


@pytest.mark.parametrize(("mode", "expected"), [("proxy", {"X-Remote-User": asgi.PROXY_USER_KEY}), ("token", {})])
def test_only_a_proxy_names_the_person(mode: str, expected: dict[str, str], loaded: list[dict[str, Any]],
                                       settings: Settings) -> None:
    policy = AccessPolicy(mode=mode, port=8501, allowed_hosts=frozenset({"127.0.0.1"}), proxy_secret="s" * 32,
                          proxy_user_header="X-Remote-User")
    asgi.build_app(policy, settings)
    assert loaded[-1]["server_trustedUserHeaders"] == expected
    assert loaded[-1]["server_enableXsrfProtection"] is True  # the rest of the options as they were
    assert asgi.streamlit_app(Path("app/main.py")) == Path("app/main.py")
    assert loaded[-1]["server_trustedUserHeaders"] == {}
