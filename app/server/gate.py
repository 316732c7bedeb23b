"""The gate in front of Streamlit: an ASGI layer that checks every request before Streamlit sees it.

Streamlit's own options cannot guard a launcher (its WebSocket handshake accepts a foreign Host
when the Origin agrees with it, streamlit#16386 and #16448), so the UI server (app/server/asgi.py)
wraps Streamlit's ASGI app in :class:`Gate`, in the same process: nothing but the gate listens.
For every HTTP request and WebSocket handshake, in order:

1. the Host must be one this UI serves (loopback names and ``--allowed-host``): DNS rebinding;
2. a browser's Origin must be the UI's own (same host and port);
3. ``/healthz`` answers ``ok`` without credentials (for monitors and container health checks);
4. the credentials of the mode (app/server/access.py): a session cookie, or the token itself in
   ``?token=`` (exchanged for the cookie, then dropped from the address bar by a redirect) or in
   an ``Authorization: token ...`` header; in proxy mode the proxy's secret and user headers.

A refused WebSocket is closed before it is accepted (the client sees HTTP 403); a refused page
gets a short page of its own that says what to do, served without any outside asset.

A page that passes is told where its server is (:func:`_telling_the_page_its_server`): Streamlit's
client otherwise looks for the server under the page's own path first (``/run/_stcore/health``,
a 404) and one level up only after a pause, 0.1 s of every new tab on every page but the Runs page.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response

from app.server import assets
from app.server.access import (
    SESSION_MAX_AGE_S,
    AccessPolicy,
    FailedLogins,
    Verdict,
    session_valid,
    sign_session,
    token_matches,
)

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

HEALTH_PATH = "/healthz"
# Headers on every answer of the gate's own: never cached, never framed, no referrer leaks a URL.
_OWN_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}

# Headers on every answer that passes through to Streamlit: its page may load code, styles, fonts,
# images and connections from its own origin only (data:/blob: where Streamlit and Vega draw), so
# text a run controls that slipped into markup still cannot fetch from elsewhere; never framed.
# Scripts from blob: are Streamlit's components v2 (the sweep page's parallel coordinates,
# app/charts/parallel.js): it loads a component's inline code as a blob: module. A blob: URL can
# only be made by a script already running in the page, which 'unsafe-inline' allows anyway, so
# this lets no new code in; nothing is fetched from elsewhere.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self' 'unsafe-inline' blob:; "
        "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self' data:; "
        "connect-src 'self' data: blob:; worker-src 'self' blob:; frame-src 'self'; object-src 'none'; "
        "base-uri 'self'; form-action 'self'; frame-ancestors 'none'"),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>runyard: {title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:42rem;margin:4rem auto;padding:0 1rem;color:#222}}
code{{background:#f2f2f2;padding:.1rem .3rem;border-radius:3px}}</style></head>
<body><h1>runyard</h1><h2>{title}</h2><p>{body}</p></body></html>
"""

_LOGIN_HELP = (
    "This dashboard starts training programs on this machine, so it answers only to people who hold "
    "its access token. On the machine that runs runyard, run <code>runyard token</code> and open the "
    "URL it prints (it looks like <code>http://127.0.0.1:8501/?token=...</code>)."
)


def _page(status: int, title: str, body_html: str) -> Response:
    return HTMLResponse(_PAGE.format(title=html.escape(title), body=body_html), status_code=status,
                        headers=_OWN_HEADERS)


# Pages a person may type that Streamlit serves under another address: the Runs page is the
# default page, which Streamlit serves at "/" only ("/runs" answered "Page not found").
PAGE_ALIASES = {"/runs": "/", "/runs/": "/"}


def _vendored(name: str) -> Response:
    """The live charts' code and Vega (app/server/assets.py: a few named files, nothing else),
    cached by the browser (their addresses carry a hash of their contents)."""
    body = assets.served(name)
    if body is None:
        return PlainTextResponse("not found", status_code=404, headers=_OWN_HEADERS)
    return Response(body, media_type="text/javascript", headers={
        **_PAGE_HEADERS, "Cache-Control": "private, max-age=86400"})


def _wants_html(headers: Headers) -> bool:
    return "text/html" in headers.get("accept", "")


class Gate:
    """An ASGI app that lets a request through to ``app`` only when ``policy`` allows it.

    Args:
        app: Streamlit's ASGI app (``st.App``).
        policy: What this UI accepts (app/server/access.py).
        health: What ``/healthz`` answers, as JSON (a blocking read, run in a worker thread);
            without it, ``{"status": "ok"}``.
    """

    def __init__(self, app: ASGIApp, policy: AccessPolicy, health: Callable[[], dict[str, Any]] | None = None) -> None:
        self.app = app
        self.policy = policy
        self.health = health
        self.failed_logins = FailedLogins()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan: starts and stops Streamlit's runtime
            return
        headers = Headers(scope=scope)
        verdict = self._check(scope, headers)
        if verdict is not None and not verdict.allowed:
            await self._refuse(scope, receive, send, headers, verdict)
            return
        if verdict is None:  # the token in the query: log in and come back without it
            await self._log_in(scope, receive, send, headers)
            return
        if scope["type"] == "http" and scope["path"] == HEALTH_PATH:
            body = await run_in_threadpool(self.health) if self.health is not None else {"status": "ok"}
            await JSONResponse(body, headers={**_OWN_HEADERS, "Cache-Control": "no-store"})(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"].startswith(assets.PATH):
            await _vendored(scope["path"][len(assets.PATH):])(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] in PAGE_ALIASES:
            query = scope.get("query_string", b"").decode("latin-1")
            target = scope.get("root_path", "") + PAGE_ALIASES[scope["path"]] + (f"?{query}" if query else "")
            await RedirectResponse(target, status_code=308, headers=_OWN_HEADERS)(scope, receive, send)
            return
        if scope["type"] == "http":
            send = _with_headers(send, _PAGE_HEADERS)
            if scope.get("method") == "GET" and _wants_html(headers):  # a page, not a script or a call
                send = _telling_the_page_its_server(send, scope["path"])
                # The page uncompressed (it is 8 kB), so that the script can go into it.
                scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"accept-encoding"]}
        await self.app(scope, receive, send)

    # -- decisions ---------------------------------------------------------------------------

    def _check(self, scope: Scope, headers: Headers) -> Verdict | None:
        """ALLOW, a refusal, or ``None`` for "a login with ``?token=``: answer with the cookie"."""
        policy = self.policy
        host = headers.get("host")
        scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
        for verdict in (policy.check_host(host), policy.check_origin(headers.get("origin"), host, scheme)):
            if not verdict.allowed:
                return verdict
        if headers.get("sec-fetch-site", "").lower() == "cross-site":
            return Verdict(False, 403, "requests sent by pages of other sites are refused")
        if scope["type"] == "http" and scope["path"] == HEALTH_PATH:
            return Verdict(True)
        if policy.mode == "none":
            return Verdict(True)
        if policy.mode == "proxy":
            return policy.check_proxy(headers)
        token = policy.token.current() if policy.token is not None else None
        supplied = _query_token(scope)
        offered = _authorization_token(headers)
        client = (scope.get("client") or ("?",))[0]
        # The token is compared before the rate limit is looked at: wrong guesses from this address
        # (every local account is 127.0.0.1) must not lock out the owner's right token.
        if supplied is not None and scope["type"] == "http":
            if token_matches(token, supplied):
                return None
            return self.failed_logins.refuse(client, 403, "wrong token")
        if session_valid(token, cookie_parser(headers.get("cookie", "")).get(policy.cookie)):
            return Verdict(True)
        if offered is not None:
            if token_matches(token, offered):
                return Verdict(True)
            return self.failed_logins.refuse(client, 401, "no valid session")
        return Verdict(False, 401, "no valid session")

    # -- answers -----------------------------------------------------------------------------

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, headers: Headers, verdict: Verdict) -> None:
        logger.info("refused %s %s (Host %r, Origin %r): %s", scope["type"], scope.get("path"),
                    headers.get("host"), headers.get("origin"), verdict.reason)
        if scope["type"] == "websocket":
            # Closing before accepting makes the server answer the handshake with HTTP 403.
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["path"] == HEALTH_PATH or not _wants_html(headers):
            response: Response = PlainTextResponse(f"{verdict.reason}\n", status_code=verdict.status,
                                                   headers=_OWN_HEADERS)
        elif verdict.status == 401 and self.policy.mode == "token":
            response = _page(401, "Log in with your token", _LOGIN_HELP)
        elif verdict.reason == "wrong token":
            response = _page(403, "That token is not this UI's",
                             "The token in the address is wrong or was replaced (<code>runyard token --rotate</code>). "
                             + _LOGIN_HELP)
        else:
            response = _page(verdict.status, "Refused", html.escape(verdict.reason))
        await response(scope, receive, send)

    async def _log_in(self, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        """Exchange the token for a session cookie and redirect to the same address without it."""
        token = self.policy.token.current() if self.policy.token is not None else None
        assert token is not None  # _check matched it
        query = [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                               keep_blank_values=True) if k != "token"]
        target = scope.get("root_path", "") + scope["path"] + (f"?{urlencode(query)}" if query else "")
        response = RedirectResponse(target, status_code=303, headers=_OWN_HEADERS)
        response.set_cookie(
            self.policy.cookie, sign_session(token), max_age=SESSION_MAX_AGE_S, path="/",
            httponly=True, samesite="strict", secure=scope.get("scheme") == "https",
        )
        logger.info("logged in a browser from %s", (scope.get("client") or ("?",))[0])
        await response(scope, receive, send)


def _with_headers(send: Send, extra: dict[str, str]) -> Send:
    """``send`` that adds ``extra`` to the response's headers, replacing any of the same name."""
    names = {name.lower().encode("latin-1") for name in extra}
    encoded = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in extra.items()]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
            message = {**message, "headers": kept + encoded}
        await send(message)

    return sending


# Streamlit's client reads its server's address from ``window.__streamlit.BACKEND_BASE_URL`` when a
# page sets it (the hook for pages that embed Streamlit); without it, it tries the page's own path
# (``/run``) and then its parent, each with a request for ``_stcore/health`` and ``host-config``,
# the second attempt about 0.1 s after the first one's 404. This server serves Streamlit at its
# root, so the server is the page's address less the path this server saw: computed in the page,
# it stays right behind a proxy that serves the UI under a prefix of its own.
_SERVER_SCRIPT = (
    "<script>(()=>{{const seen={seen};const p=location.pathname;"
    "if(p.endsWith(seen))window.__streamlit={{BACKEND_BASE_URL:"
    "location.origin+p.slice(0,p.length-seen.length)+'/'}};}})();</script>"
)


def _telling_the_page_its_server(send: Send, path: str) -> Send:
    """``send`` that puts :data:`_SERVER_SCRIPT` at the top of an HTML page's ``<head>`` (Streamlit's
    index.html, which it serves for every page's address), its length corrected and its
    validators dropped (the cached copy must be this one); every other answer passes as it is."""
    seen = json.dumps(path).replace("<", "\\u003c").replace(">", "\\u003e")  # inside <script>
    script = _SERVER_SCRIPT.format(seen=seen).encode()
    start: Message | None = None
    body: list[bytes] = []

    async def sending(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            headers = Headers(raw=message.get("headers", []))
            if (message["status"] == 200 and headers.get("content-type", "").startswith("text/html")
                    and "content-encoding" not in headers):
                start = message  # held until the whole page is here
                return
        elif message["type"] == "http.response.body" and start is not None:
            body.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            page = b"".join(body)
            head = page.lower().find(b"<head>")
            if head >= 0:
                page = page[:head + 6] + script + page[head + 6:]
            dropped = {b"content-length", b"etag", b"last-modified"}
            kept = [(k, v) for k, v in start.get("headers", []) if k.lower() not in dropped]
            await send({**start, "headers": [*kept, (b"content-length", str(len(page)).encode())]})
            await send({"type": "http.response.body", "body": page, "more_body": False})
            return
        await send(message)

    return sending


def _query_token(scope: Scope) -> str | None:
    query: bytes = scope.get("query_string", b"")
    for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if key == "token":
            return value
    return None


def _authorization_token(headers: Headers) -> str | None:
    """The token of ``Authorization: token T`` or ``Authorization: Bearer T`` (Jupyter's forms)."""
    value = headers.get("authorization", "")
    scheme, _, credential = value.partition(" ")
    if scheme.lower() in ("token", "bearer") and credential.strip():
        return credential.strip()
    return None
