"""Reaching the web UI, as the CLI and the UI server both need it: the access token file, the
bind address, and ``ui.json`` (where a running UI listens).

The UI is a launcher: whoever reaches it starts any script as the user who runs runyard. Jupyter
draws the line we follow ("access means access to running arbitrary code"): a random token guards
the UI by default, on loopback too. The token lives in the data folder (mode 0600, created on
first use, replaced by ``runyard token --rotate``); ``runyard ui``, ``up`` and ``token`` (the CLI)
and ``app/server/asgi.py`` read it here, refuse a bind that would open the UI without a guard, and
build the URL that logs a browser in. What the UI checks on every request (the session cookie,
Host and Origin) is ``app/server/access.py``: it serves the web UI alone.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from db.vocabulary.layout import UI_FILE
from orchestrator import OrchestratorError

TOKEN_BYTES = 32
AUTH_MODES = ("token", "proxy", "none")
ALLOWED_HOSTS_ENV = "RUNYARD_ALLOWED_HOSTS"
PROXY_SECRET_ENV = "RUNYARD_PROXY_SECRET"  # noqa: S105 - a variable's name, not a secret
DEFAULT_PROXY_USER_HEADER = "X-Forwarded-User"
PROXY_SECRET_HEADER = "X-Runyard-Proxy-Secret"  # noqa: S105 - a header's name, not a secret


class AccessError(OrchestratorError):
    """The UI cannot be served as asked (an open bind without auth, proxy mode without a secret)."""


# -- the token -------------------------------------------------------------------------------


def new_token() -> str:
    """A fresh random token: 32 bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def read_token(path: Path) -> str | None:
    """The token kept in ``path``, or ``None`` when there is none (or the file is empty)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    return text or None


def ensure_token(path: Path) -> str:
    """The token in ``path``, created (mode 0600, never readable by others) when missing.

    The token is written to a private temporary file and then linked into place, which fails if
    the name exists: two processes starting together agree on one token, and neither can read
    the other's file half-written (an ``O_EXCL`` create would be seen empty for a moment). A
    token file that others could read (an older install, a copy) is narrowed to 0600.
    """
    token = read_token(path)
    if token is None:
        candidate = new_token()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.new")
        _write_private(tmp, candidate)
        try:
            os.link(tmp, path)
        except FileExistsError:
            token = read_token(path)
            if token is None:  # an empty file left behind by an older runyard: replace it
                token = rotate_token(path)
            return token
        finally:
            tmp.unlink(missing_ok=True)
        return candidate
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    return token


def rotate_token(path: Path) -> str:
    """Replace the token in ``path`` with a new one (atomically); every old session ends."""
    token = new_token()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _write_private(tmp, token)
    os.replace(tmp, path)
    return token


def _write_private(path: Path, token: str) -> None:
    """``token`` and a newline into a new file readable by its owner only, synced to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())


class TokenSource:
    """The current token of a running UI, read again whenever its file changes.

    ``runyard token --rotate`` replaces the file; the running UI sees the new token on its next
    request (one ``stat`` a request), so old cookies and the old token stop working at once.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._seen: tuple[int, int, int] | None = None
        self._token: str | None = None

    def current(self) -> str | None:
        """The token now in force, or ``None`` when the file is gone (nothing is then accepted)."""
        try:
            st = self._path.stat()
        except FileNotFoundError:
            self._seen, self._token = None, None
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._seen:
            self._token = read_token(self._path)
            self._seen = key
        return self._token


# -- host names and the bind address ----------------------------------------------------------


def normalize_host(name: str) -> str:
    """A host name as compared: lower case, no trailing dot, IPv6 without brackets."""
    name = name.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name


def parse_allowed_hosts(names: Iterable[str]) -> frozenset[str]:
    """Host names from ``--allowed-host`` and ``RUNYARD_ALLOWED_HOSTS`` (comma-separated), checked.

    Raises:
        AccessError: a name that is not a plain host name or address (a port, a scheme, a path).
    """
    out: set[str] = set()
    for raw in names:
        for part in raw.split(","):
            name = normalize_host(part)
            if not name:
                continue
            if any(c in name for c in "/@ :\t*") and not _is_ip(name):
                raise AccessError(
                    f"allowed host {part.strip()!r} is not a host name: give a name or an address "
                    "without scheme, port or path (e.g. --allowed-host workstation.lan)")
            out.add(name)
    return frozenset(out)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the UI on this machine (127.0.0.0/8, ::1, localhost)."""
    name = normalize_host(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """Whether ``host`` binds every interface (0.0.0.0, ::)."""
    try:
        return ipaddress.ip_address(normalize_host(host)).is_unspecified
    except ValueError:
        return False


def check_bind(host: str, mode: str, proxy_secret: str | None) -> str | None:
    """Why the UI must not start this way (an open bind without auth, proxy mode without a
    secret), or ``None`` when it may."""
    if mode not in AUTH_MODES:
        return f"--auth {mode!r} is not one of {', '.join(AUTH_MODES)}"
    if mode == "none" and not is_loopback(host):
        return (f"--no-auth is refused with --host {host}: anyone who reaches that address could start "
                "any program as you. Keep the token (the default), or use --auth proxy behind a proxy "
                "that authenticates, or bind 127.0.0.1")
    if mode == "proxy" and not proxy_secret:
        return (f"--auth proxy needs the secret your reverse proxy sends in {PROXY_SECRET_HEADER}: "
                f"set {PROXY_SECRET_ENV} (at least 16 characters)")
    if mode == "proxy" and proxy_secret is not None and len(proxy_secret) < 16:
        return (f"{PROXY_SECRET_ENV} is {len(proxy_secret)} characters long: use at least 16 "
                "(e.g. `openssl rand -hex 32`)")
    return None


def open_bind_warning(host: str) -> str | None:
    """The warning for a UI bound beyond loopback (plain HTTP carries the token and the cookie)."""
    if is_loopback(host):
        return None
    return (f"warning: the UI listens on {host}, beyond this machine, over plain HTTP: the token and the "
            "session cookie cross the network readable by anyone on the path. Prefer an SSH tunnel "
            "(ssh -L 8501:127.0.0.1:8501 THIS_HOST, then open the URL on your laptop) or a TLS proxy.")


# -- the URL to open -------------------------------------------------------------------------


def url_host(bind_host: str) -> str:
    """The host to put in the URL for a UI bound on ``bind_host`` (a wildcard bind: 127.0.0.1)."""
    if is_wildcard(bind_host):
        return "127.0.0.1"
    name = normalize_host(bind_host)
    return f"[{name}]" if ":" in name else name


def login_url(bind_host: str, port: int, token: str) -> str:
    """``http://127.0.0.1:PORT/?token=TOKEN``: opening it logs the browser in."""
    return f"http://{url_host(bind_host)}:{port}/?token={token}"


def write_ui_file(home: Path, host: str, port: int, mode: str) -> Path:
    """Record where the running UI listens (``runyard token`` builds its URL from it)."""
    path = home / UI_FILE
    tmp = path.with_name(f".{UI_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"host": host, "port": port, "auth": mode, "pid": os.getpid(),
                               "started_at": time.time()}))
    os.replace(tmp, path)
    return path


def read_ui_file(home: Path) -> dict[str, object] | None:
    """Where a UI last started on this home listens, or ``None`` when none is recorded."""
    try:
        data = json.loads((home / UI_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None
