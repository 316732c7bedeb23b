"""Sending one message to one channel.

Apprise sends to every service it knows (Slack, Discord, Teams, Matrix, Telegram, ntfy, email
over SMTP, generic JSON/form webhooks). runyard's own signed webhook is for programs: a POST of
``{"run", "trigger", "kind", "message", "link", ...}`` with the header
``X-Runyard-Signature: sha256=<hex HMAC-SHA256 of the body under the channel's secret>``.

The webhook's host is resolved once per delivery; every address it resolves to is checked, and
the connection goes to that address (TLS still verifies the certificate for the name), so a DNS
answer that changes between the check and the connect (rebinding) cannot send the request
elsewhere. Link-local addresses (169.254.0.0/16, fe80::/10), the unspecified address and the
cloud metadata endpoints are refused, however the host spells them (:mod:`.hosts`), unless the
channel allows the host by name (``--allow HOST``). An Apprise URL's hosts (the URL's and the
ones Apprise's service object names, such as an email channel's ``?smtp=``) are checked the same
way before the send, and while it runs every lookup Apprise makes of them is pinned to the address
checked, or checked itself (:func:`pinned`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import re
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from orchestrator.alerts import AlertsError
from orchestrator.alerts.hosts import allowed, bare, host_problem, literal_address, plugin_hosts, refused
from orchestrator.alerts.store import Channel

SIGNATURE_HEADER = "X-Runyard-Signature"
TIMEOUT_S = 10.0


class DeliveryError(AlertsError):
    """A message that did not reach its channel; the message says why (no secret in it)."""


@dataclass(frozen=True)
class Note:
    """One message: the title, the one-line body, and the fields of the signed webhook's JSON."""

    title: str
    body: str
    payload: dict[str, Any] = field(default_factory=dict)


def sign(secret: str, body: bytes) -> str:
    """The header value for ``body``: ``sha256=<hex HMAC-SHA256>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def resolve(host: str, port: int, allow: tuple[str, ...] = ()) -> str:
    """Resolve ``host`` once and return the address to connect to.

    Raises:
        DeliveryError: it does not resolve, or to a refused address, and is not allowed by name.
    """
    problem = host_problem(host, allow)  # a metadata name, or a refused address in any spelling
    if problem:
        raise DeliveryError(problem)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise DeliveryError(f"{host} does not resolve: {exc}") from None
    addresses = [str(info[4][0]) for info in infos]
    if not allowed(host, allow):
        for address in addresses:
            why = refused(address)
            if why:
                raise DeliveryError(f"{host} resolves to {address}, {why}; refused (allow it by name with "
                                    f"--allow {host})")
    return addresses[0]


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a fixed address, with SNI and certificate checks for the host name."""

    def __init__(self, host: str, address: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, address: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


def send_signed(channel: Channel, note: Note, timeout: float = TIMEOUT_S) -> None:
    """POST the signed JSON body to the channel's webhook, pinned to the address resolved once."""
    parts = urlsplit(channel.url)
    tls = parts.scheme == "runyard+https"
    host = parts.hostname or ""
    port = parts.port or (443 if tls else 80)
    address = resolve(host, port, channel.allow)
    body = json.dumps(note.payload, sort_keys=True).encode()
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn: http.client.HTTPConnection = (_PinnedHTTPS if tls else _PinnedHTTP)(host, address, port, timeout)
    try:
        conn.request("POST", path, body=body, headers={
            "Content-Type": "application/json", "User-Agent": "runyard-alerts",
            SIGNATURE_HEADER: sign(channel.secret or "", body)})
        response = conn.getresponse()
        response.read(4096)
    except (OSError, http.client.HTTPException) as exc:
        raise DeliveryError(f"{channel.masked}: {type(exc).__name__}: {exc}") from None
    finally:
        conn.close()
    if not 200 <= response.status < 300:
        raise DeliveryError(f"{channel.masked}: HTTP {response.status} {response.reason}")


# Names pinned while a send to them runs (:func:`pinned`): what Apprise's HTTP client (requests,
# urllib3) or its SMTP client resolves, in whichever of Apprise's threads it runs. {name: [address,
# sends in flight, refusals]}, under the lock; address None: the name resolves as usual, but an
# answer with a refused address fails the lookup (and the reason is kept for the send's error).
_PINS: dict[str, list[Any]] = {}
_PINS_LOCK = threading.Lock()


def _pinning(resolver: Any) -> Any:
    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(host, str):
            return resolver(host, port, *args, **kwargs)
        with _PINS_LOCK:
            pin = _PINS.get(bare(host))
        if pin is None:
            return resolver(host, port, *args, **kwargs)
        if pin[0] is not None:
            return resolver(pin[0], port, *args, **kwargs)
        answers = resolver(host, port, *args, **kwargs)
        for answer in answers:
            why = refused(str(answer[4][0]))
            if why:
                said = f"{host} resolves to {answer[4][0]}, {why}; refused (allow it by name with --allow {host})"
                pin[2].append(said)
                raise socket.gaierror(socket.EAI_FAIL, said)
        return answers

    getaddrinfo.runyard_pinning = True  # type: ignore[attr-defined]
    return getaddrinfo


@contextlib.contextmanager
def pinned(host: str, address: str | None) -> Iterator[list[str]]:
    """While the block runs, lookups of ``host`` in this process give ``address`` (the one that
    :func:`resolve` checked): a name re-pointed between the check and the connection (DNS
    rebinding) cannot move the send. With ``address`` None (a name that did not resolve at the
    check, or a bare word that may be a token), a lookup of ``host`` is answered as usual but
    fails when an answer is a refused address: what is checked is what is connected to. Apprise
    sends from a thread of its own, so the pin is the process's, for as long as a send to that
    name runs; other names resolve as before. The certificate is still checked against ``host``
    (the client keeps the name for SNI). Yields the lookups refused meanwhile, in words."""
    key = bare(host)
    with _PINS_LOCK:
        if not getattr(socket.getaddrinfo, "runyard_pinning", False):
            socket.getaddrinfo = _pinning(socket.getaddrinfo)  # once, around whatever resolver is there
        pin = _PINS.setdefault(key, [address, 0, []])
        pin[1] += 1
    try:
        yield pin[2]
    finally:
        with _PINS_LOCK:
            pin[1] -= 1
            if pin[1] == 0:
                del _PINS[key]


def _apprise_pin(host: str, allow: tuple[str, ...]) -> contextlib.AbstractContextManager[list[str] | None]:
    """The pin for one host of an Apprise send, after its check (:func:`resolve`): a literal
    address needs none; a name with a dot (or ``localhost``) is resolved once and pinned; any
    other word (often a token in the host's place, which Apprise never looks up) and a name that
    did not resolve are checked whenever Apprise looks them up."""
    problem = host_problem(host, allow)
    if problem:
        raise DeliveryError(problem)
    if literal_address(host) is not None:
        return contextlib.nullcontext()
    if "." in bare(host) or bare(host) == "localhost":
        try:
            return pinned(host, resolve(bare(host), 0, allow))
        except DeliveryError as exc:
            if "does not resolve" not in str(exc):
                raise
    return contextlib.nullcontext() if allowed(host, allow) else pinned(host, None)


def send_apprise(channel: Channel, note: Note) -> None:
    """Send through Apprise; its own log lines say why a send failed. Every host the URL and
    Apprise's service object name is checked (:func:`.hosts.host_problem`), and a host name is
    resolved once, checked (:func:`resolve`) and pinned for the send (:func:`pinned`)."""
    import apprise  # noqa: PLC0415 - Apprise (0.5 s) only to send

    service = apprise.Apprise.instantiate(channel.url)
    if service is None:
        raise DeliveryError(f"{channel.masked}: Apprise does not understand this URL")
    hosts = {bare(h): h for h in (urlsplit(channel.url).hostname or "", *plugin_hosts(service)) if h}
    sender = apprise.Apprise()
    sender.add(service)
    with contextlib.ExitStack() as pins:
        refusals = [pins.enter_context(_apprise_pin(host, channel.allow)) for host in hosts.values()]
        with apprise.LogCapture(level=apprise.logging.WARNING) as log:
            ok = sender.notify(body=note.body, title=note.title)
            said = log.getvalue().strip() if hasattr(log, "getvalue") else ""
    if not ok:
        if refused_lookups := [r for found in refusals if found for r in found]:
            raise DeliveryError(refused_lookups[-1])  # Apprise says only "a connection error occurred"
        lines = [re.sub(r"^[0-9-]+ [0-9:,]+ - [A-Z]+ - ", "", line) for line in said.splitlines() if line.strip()]
        raise DeliveryError(f"{channel.masked}: {lines[-1] if lines else 'Apprise could not deliver it'}"[:500])


def send(channel: Channel, note: Note) -> None:
    """Deliver ``note`` to ``channel``.

    Raises:
        DeliveryError: it was not delivered (the message names the channel masked, and why).
    """
    if channel.signed:
        send_signed(channel, note)
    else:
        send_apprise(channel, note)
