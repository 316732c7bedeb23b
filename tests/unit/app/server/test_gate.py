"""The gate in front of Streamlit (app/server/gate.py), answering requests as the server would: a
local account's wrong guesses never lock out the right token nor the scraper.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from app.server import assets
from app.server.access import AccessPolicy
from app.server.gate import Gate
from app.server.prometheus import MetricsRoute
from orchestrator.ui_access import TokenSource, ensure_token, new_token


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


def test_the_live_charts_code_and_vega_are_served_to_a_logged_in_browser_only(tmp_path: Path) -> None:
    """The gate's own files (app/server/assets.py): the live chart's code and Vega, as
    scripts, to a browser with the token only; any other name under their path is not found."""
    token = ensure_token(tmp_path / "token")
    app = Gate(_streamlit, AccessPolicy(mode="token", port=8501, token=TokenSource(tmp_path / "token")))
    signed_in = {"Authorization": f"token {token}"}
    for name in (*assets.VENDOR_FILES, assets.CODE):
        assert _status(app, f"{assets.PATH}{name}", headers=signed_in) == 200
        assert _status(app, f"{assets.PATH}{name}") in (401, 403)  # no credentials
    assert _status(app, f"{assets.PATH}LICENSE", headers=signed_in) == 404
    assert _status(app, f"{assets.PATH}../gate.py", headers=signed_in) == 404
