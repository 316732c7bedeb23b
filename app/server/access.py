"""Who may use the web UI: the session cookie and the Host and Origin rules of every request.

Binding 127.0.0.1 alone is no guard: any web page the user opens can reach a loopback port through
DNS rebinding (its own name, re-pointed at 127.0.0.1), so every request must also name a Host this
UI serves and, when a browser sends one, an Origin of the same host and port.

This module holds the rules as plain functions (no web framework, no torch): the signed session
cookie a valid token is exchanged for (itsdangerous' ``TimestampSigner``, keyed by the token, so a
rotation ends every session), the Host/Origin checks, the proxy mode's headers, and the login
rate limit. ``app/server/gate.py`` applies them to every HTTP request and WebSocket handshake before
Streamlit sees it. The token file itself, the bind rules and ``ui.json`` are
orchestrator/ui_access.py, which the CLI shares.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from itsdangerous import BadSignature, TimestampSigner

from orchestrator.ui_access import (
    DEFAULT_PROXY_USER_HEADER,
    PROXY_SECRET_HEADER,
    TokenSource,
    normalize_host,
)

# A session lasts a month; a rotated token ends it at once.
SESSION_MAX_AGE_S = 30 * 24 * 3600
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
_SESSION_CONTEXT = b"runyard-ui-session-v1"
_SESSION_VALUE = b"session"
_CLOCK_SKEW_S = 60


def token_matches(token: str | None, supplied: str | None) -> bool:
    """Whether ``supplied`` is the token (in constant time)."""
    if not token or not supplied:
        return False
    return hmac.compare_digest(token.encode(), supplied.encode())


# -- the session cookie ----------------------------------------------------------------------


class _SessionSigner(TimestampSigner):
    """itsdangerous' timestamp signer, keyed by the token, with the clock given (tests, ``issued``)."""

    def __init__(self, token: str, now: float | None = None) -> None:
        super().__init__(token, salt=_SESSION_CONTEXT, key_derivation="hmac", digest_method=hashlib.sha256)
        self._now = now

    def get_timestamp(self) -> int:
        return int(time.time() if self._now is None else self._now)


def sign_session(token: str, issued: int | None = None) -> str:
    """A session cookie value issued now (or at ``issued``), signed with a key drawn from ``token``."""
    return _SessionSigner(token, issued).sign(_SESSION_VALUE).decode("ascii")


def session_valid(token: str | None, value: str | None, now: float | None = None) -> bool:
    """Whether ``value`` is a session cookie signed with ``token`` and not older than a month."""
    if not token or not value:
        return False
    now = time.time() if now is None else now
    # A cookie issued up to a minute "in the future" (the clock stepped back) is still good: seen
    # from a minute later, its age lies in [0, max age + 1 minute] exactly when it is valid.
    signer = _SessionSigner(token, now + _CLOCK_SKEW_S)
    try:
        return signer.unsign(value, max_age=SESSION_MAX_AGE_S + _CLOCK_SKEW_S) == _SESSION_VALUE
    except BadSignature:  # also SignatureExpired, and a value that is no signed cookie at all
        return False


def cookie_name(port: int) -> str:
    """The session cookie's name: one per port, since cookies ignore ports (two UIs on one host
    would otherwise overwrite each other's sessions)."""
    return f"runyard-session-{port}"


# -- Host and Origin -------------------------------------------------------------------------


def split_host(value: str) -> tuple[str, int | None] | None:
    """``(host, port)`` of a Host header (``127.0.0.1:8501``, ``[::1]:8501``, ``localhost``);
    ``None`` when it cannot be parsed."""
    value = value.strip()
    if not value or any(c in value for c in "/@ \t\\?#"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else ""
    elif value.count(":") == 1:
        host, port_text = value.split(":")
    elif ":" in value:
        return None  # a bare IPv6 address must be bracketed in a Host header
    else:
        host, port_text = value, ""
    if port_text and (not port_text.isdigit() or not 0 < int(port_text) < 65536):
        return None
    return normalize_host(host), int(port_text) if port_text else None


def _default_port(scheme: str) -> int | None:
    return {"http": 80, "https": 443, "ws": 80, "wss": 443}.get(scheme)


@dataclass(frozen=True)
class Verdict:
    """The answer to one request: allowed, or refused with an HTTP status and a sentence."""

    allowed: bool
    status: int = 200
    reason: str = ""


ALLOW = Verdict(True)


# A client that sent this many wrong tokens within the window gets 429 for its next wrong ones
# until the oldest of them is older than the window. A token is 256 bits, so this is not what
# stops guessing; it keeps a script that tries from flooding the log and the CPU. The right token
# is never refused: every local account is 127.0.0.1, and any of them could lock the owner out.
FAILED_LOGINS_ALLOWED = 10
FAILED_LOGINS_WINDOW_S = 60.0


class FailedLogins:
    """Wrong tokens per client address in a sliding window (the gate's login rate limit).

    Only wrong tokens are counted and limited (:meth:`refuse`): the right token, and a browser
    that holds a valid session cookie, are never locked out by someone else's guesses; all of the
    machine's local accounts share the one address 127.0.0.1.
    """

    def __init__(self, allowed: int = FAILED_LOGINS_ALLOWED, window_s: float = FAILED_LOGINS_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed = allowed
        self.window_s = window_s
        self.clock = clock
        self._failures: dict[str, collections.deque[float]] = {}

    def _recent(self, client: str) -> collections.deque[float]:
        failures = self._failures.setdefault(client, collections.deque())
        now = self.clock()
        while failures and now - failures[0] > self.window_s:
            failures.popleft()
        if not failures:
            del self._failures[client]  # no entry kept for a client without recent failures
            return collections.deque()
        return failures

    def blocked_for(self, client: str) -> float:
        """Seconds until ``client`` may offer a token again; 0 when it may now."""
        failures = self._recent(client)
        if len(failures) < self.allowed:
            return 0.0
        return max(0.0, self.window_s - (self.clock() - failures[0]))

    def failed(self, client: str) -> None:
        """Count one wrong token from ``client``."""
        self._recent(client)
        self._failures.setdefault(client, collections.deque()).append(self.clock())

    def refuse(self, client: str, status: int, reason: str) -> Verdict:
        """The answer to a wrong token from ``client``: ``status`` with ``reason``, counted; once
        it sent too many, 429 with the wait (not counted, so the wait ends a window after the
        oldest). Call it only after the token was compared: the right one gets in regardless."""
        wait_s = self.blocked_for(client)
        if wait_s > 0:
            return Verdict(False, 429, f"too many wrong tokens from {client}; try again in {wait_s:.0f} s")
        self.failed(client)
        return Verdict(False, status, reason)


@dataclass(frozen=True)
class AccessPolicy:
    """What a running UI accepts.

    Attributes:
        mode: ``token`` (default), ``proxy`` (a trusted reverse proxy authenticates) or ``none``.
        port: The port the UI listens on (names the cookie).
        allowed_hosts: Host names served besides the loopback ones.
        token: The token in force (``token`` mode).
        proxy_secret: The secret a trusted proxy must send (``proxy`` mode).
        proxy_user_header: The header that carries the proxy's authenticated user.
    """

    mode: str
    port: int
    allowed_hosts: frozenset[str] = frozenset()
    token: TokenSource | None = None
    proxy_secret: str | None = None
    proxy_user_header: str = DEFAULT_PROXY_USER_HEADER
    served: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "served", LOOPBACK_NAMES | self.allowed_hosts)

    @property
    def cookie(self) -> str:
        return cookie_name(self.port)

    def hosts_sentence(self) -> str:
        return ", ".join(sorted(self.served))

    def check_host(self, host_header: str | None) -> Verdict:
        """Refuse a request whose Host this UI does not serve (DNS rebinding)."""
        parsed = split_host(host_header or "")
        if parsed is None or not parsed[0] or parsed[0] not in self.served:
            return Verdict(False, 403, (
                f"this runyard UI does not answer to the host {host_header or '(none)'!r}; it serves "
                f"{self.hosts_sentence()}. To reach it under another name, start it with "
                "--allowed-host NAME (or set RUNYARD_ALLOWED_HOSTS)."))
        # A loopback name reaches this UI directly, so a port in Host must be the one it serves.
        if parsed[1] is not None and parsed[0] in LOOPBACK_NAMES and parsed[1] != self.port:
            return Verdict(False, 403, (
                f"this runyard UI listens on port {self.port}, not on the port of the host "
                f"{host_header!r}; open http://127.0.0.1:{self.port}/ (through an SSH tunnel, forward the "
                f"same port: ssh -L {self.port}:127.0.0.1:{self.port} HOST)"))
        return ALLOW

    def check_origin(self, origin: str | None, host_header: str | None, scheme: str | None = None) -> Verdict:
        """Refuse a browser request sent from a page of another origin than the UI's own.

        Browsers send ``Origin`` on every WebSocket handshake and every cross-origin or
        state-changing request; programs send none, and are then judged by their credentials
        alone. The Origin must name the same host and port as the request's Host: a page on
        ``localhost:3000`` is the same *site* as the UI on ``localhost:8501`` (cookies ignore
        ports), but not the same origin.
        """
        if origin is None:
            return ALLOW
        refused = Verdict(False, 403,
                          f"requests from pages of {origin!r} are refused: only the UI's own pages may call it")
        if origin == "null":
            return refused
        try:
            parts = urlsplit(origin)
            origin_port = parts.port or _default_port(parts.scheme)
        except ValueError:
            return refused
        host = split_host(host_header or "")
        if parts.scheme not in ("http", "https") or not parts.hostname or host is None:
            return refused
        origin_host = normalize_host(parts.hostname)
        if origin_host not in self.served or origin_host != host[0]:
            return refused
        # Without a port in Host (a reverse proxy on 80/443), the origin's default port stands for it.
        if host[1] is not None and origin_port != host[1]:
            return refused
        # Reached directly on its own port, the UI's origin has the scheme it is served with.
        if scheme is not None and host[1] == self.port and parts.scheme != scheme:
            return refused
        return ALLOW

    def check_proxy(self, headers: Mapping[str, str]) -> Verdict:
        """In proxy mode: the shared secret and a user name, both from the proxy."""
        supplied = headers.get(PROXY_SECRET_HEADER.lower())
        user = (headers.get(self.proxy_user_header.lower()) or "").strip()
        if not token_matches(self.proxy_secret, supplied) or not user:
            return Verdict(False, 401, (
                f"this runyard UI trusts only its reverse proxy: a request must carry {PROXY_SECRET_HEADER} "
                f"with the shared secret and {self.proxy_user_header} with the user"))
        return ALLOW
