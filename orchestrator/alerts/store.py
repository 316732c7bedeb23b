"""The alert channels and the global defaults: ``alerts.json`` in the data folder, mode 0600.

A channel is an Apprise URL (``json://``, ``mailto://``, ``slack://``, ``ntfy://``...) or
runyard's own signed webhook (``runyard+https://HOST/PATH``, ``runyard+http://...``) with a
per-channel secret. The file holds the URLs and secrets; the database only ever holds a
channel's masked URL (:func:`mask_url`), which is also what the UI, the CLI and the logs show.
Writers take an exclusive lock on the file and replace it whole.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from db.vocabulary.config import DEFAULT_TRIGGERS, trigger_problem
from db.vocabulary.layout import ALERTS_FILE
from orchestrator.alerts import AlertsError, RefusedValue
from orchestrator.alerts.hosts import host_problem, plugin_hosts

SIGNED_SCHEMES = ("runyard+http", "runyard+https")
# A signed webhook's secret given with --secret: HMAC-SHA256 under a short key can be found by
# trying keys against one signed message; runyard's own secrets are 64 hex characters.
SECRET_MIN_CHARS = 16
QUIET_HOURS = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])-([01][0-9]|2[0-3]):([0-5][0-9])$")


@dataclass(frozen=True)
class Channel:
    """One place alerts go.

    Attributes:
        id: Its number (``runyard alerts rm ID``).
        url: The Apprise URL or the signed webhook's URL, secrets included.
        on: The triggers it takes; empty: every trigger enabled for the run.
        secret: The signed webhook's HMAC key (None for Apprise channels).
        allow: Host names whose link-local or metadata addresses this channel may reach.
    """

    id: int
    url: str
    on: tuple[str, ...] = ()
    secret: str | None = None
    allow: tuple[str, ...] = ()
    created_at: float = 0.0

    @property
    def signed(self) -> bool:
        return urlsplit(self.url).scheme in SIGNED_SCHEMES

    @property
    def masked(self) -> str:
        return mask_url(self.url)

    def takes(self, trigger: str, on_by_default: bool) -> bool:
        """Whether an alert of ``trigger`` goes here: a channel added with ``--on`` takes those
        triggers (even one the defaults leave off), any other the triggers ``on_by_default``."""
        return trigger in self.on if self.on else on_by_default


@dataclass(frozen=True)
class Defaults:
    """The global rules (a run's ``[alerts]`` changes them for that run).

    Attributes:
        triggers: The triggers on by default.
        repeat_s: Default repeat interval of a still-true alert (a run's ``alerts.repeat_s`` wins).
        quiet_hours: ``"22:00-07:00"`` (local time) or empty: during them only ``urgent``
            triggers are delivered; the others wait for the end of the quiet hours.
        urgent: The triggers delivered during quiet hours.
        day_budget_usd: ``budget`` also fires when the day's cost over every run passes
            50/80/100% of this (0: none).
        ui_url: The UI's address for the links in messages (default: where the UI last
            listened, from ``ui.json``).
    """

    triggers: tuple[str, ...] = DEFAULT_TRIGGERS
    repeat_s: float = 3600.0
    quiet_hours: str = ""
    urgent: tuple[str, ...] = ("failed", "hang")
    day_budget_usd: float = 0.0
    ui_url: str = ""


@dataclass(frozen=True)
class AlertSettings:
    channels: tuple[Channel, ...] = ()
    defaults: Defaults = field(default_factory=Defaults)

    def watched(self) -> tuple[str, ...]:
        """The triggers looked for: the defaults' and every one a channel's ``--on`` names."""
        return tuple(dict.fromkeys((*self.defaults.triggers, *(t for c in self.channels for t in c.on))))

    def channel(self, channel_id: int) -> Channel:
        for c in self.channels:
            if c.id == channel_id:
                return c
        raise RefusedValue(f"channel {channel_id} does not exist (runyard alerts ls lists them)")


def off_by_default_note(channel: Channel, defaults: Defaults) -> str | None:
    """What a channel's ``--on`` does for a trigger the defaults leave off (said when it is added)."""
    off = [t for t in channel.on if t not in defaults.triggers]
    if not off:
        return None
    one = len(off) == 1
    return (f"{', '.join(off)} {'is' if one else 'are'} off in the defaults: channel {channel.id} gets "
            f"{'it' if one else 'them'} all the same, the other channels do not (the defaults' triggers turn one "
            "on for every channel; a run's [alerts] off still wins)")


def mask_url(url: str) -> str:
    """The URL with its secrets replaced by ``***``: the password, every path segment, every
    query value; the host kept when it looks like one (a token in the host's place is masked)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "***"
    if not re.fullmatch(r"[0-9.]+|localhost|[0-9a-f:]+|[a-z0-9-]+(\.[a-z0-9-]+)+", host):
        host = (host[:3] + "***") if host else ""
    user = f"{parts.username}:***@" if parts.username and parts.password else (
        f"{parts.username}@" if parts.username else "")
    text = f"{parts.scheme}://{user}{host}{f':{port}' if port else ''}"
    if parts.path.strip("/"):
        text += "/***"
    query = parse_qsl(parts.query, keep_blank_values=True)
    if query:
        text += "?" + "&".join(f"{k}=***" for k, _ in query)
    return text


def quiet_problem(text: str) -> str | None:
    """Why ``text`` is not quiet hours (``HH:MM-HH:MM``, or empty for none), or None."""
    if not text or QUIET_HOURS.match(text):
        return None
    return f"quiet_hours = {text!r}: expected HH:MM-HH:MM (24-hour local time, e.g. 22:00-07:00) or empty"


def check_url(url: str, allow: tuple[str, ...] = ()) -> None:
    """Refuse a channel URL that cannot work, or whose host is a place an alert may not go (a
    metadata, link-local or unspecified address in any spelling, :mod:`.hosts`), naming it (masked).

    Raises:
        RefusedValue: what is wrong, and what to do.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError as exc:
        raise RefusedValue(f"channel URL {mask_url(url)}: {exc}") from None
    if not parts.scheme:
        raise RefusedValue(f"channel URL {mask_url(url)}: no scheme; an Apprise URL (json://, mailto://, slack://, "
                           "ntfy://...) or runyard+https://HOST/PATH for runyard's signed webhook")
    hosts = [host]
    if parts.scheme in SIGNED_SCHEMES:
        if not host:
            raise RefusedValue(f"channel URL {mask_url(url)}: no host")
    else:
        import apprise  # noqa: PLC0415 - Apprise (0.5 s) only to check an Apprise URL

        with _apprise_unheard():  # its "Unparseable URL" line would stand beside the one sentence below
            service = apprise.Apprise.instantiate(url)
        if service is None:
            raise RefusedValue(f"channel URL {mask_url(url)}: Apprise does not understand it (see "
                               "https://github.com/caronc/apprise/wiki for the URL of each service)")
        hosts += plugin_hosts(service)  # what it connects to: Apprise drops a trailing dot, takes ?smtp=
    for name in hosts:
        problem = host_problem(name, allow)
        if problem:
            raise RefusedValue(f"channel URL {mask_url(url)}: {problem}")


def ui_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the UI's address in messages' links (empty: where the UI last
    listened), or None."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
        scheme, host = parts.scheme, parts.hostname
    except ValueError:
        scheme, host = "", None
    if scheme not in ("http", "https") or not host or any(ord(c) < 33 or ord(c) == 127 for c in url):
        return (f"ui_url = {url!r}: the UI's http:// or https:// address (e.g. https://runyard.example.com), or "
                "empty for where the UI last listened")
    return None


@contextmanager
def _apprise_unheard() -> Iterator[None]:
    """Apprise's log lines kept from the process's handlers for the block."""
    log = logging.getLogger("apprise")
    before, log.propagate = log.propagate, False
    try:
        yield
    finally:
        log.propagate = before


def secret_problem(secret: str) -> str | None:
    """Why ``secret`` cannot sign a webhook (:data:`SECRET_MIN_CHARS`), or None."""
    if len(secret) < SECRET_MIN_CHARS:
        return (f"--secret: {len(secret)} characters; a signing secret needs at least {SECRET_MIN_CHARS} "
                "(leave --secret out for a random one of 64)")
    return None


class AlertStore:
    """Read and change ``alerts.json`` in ``home``."""

    def __init__(self, home: Path):
        self.path = Path(home) / ALERTS_FILE

    def load(self) -> AlertSettings:
        """The channels and defaults; none and the built-in defaults when the file is absent."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return AlertSettings()
        except (OSError, ValueError) as exc:
            raise AlertsError(f"{self.path} cannot be read: {exc}") from None
        channels = tuple(Channel(id=int(c["id"]), url=str(c["url"]), on=tuple(c.get("on") or ()),
                                 secret=c.get("secret"), allow=tuple(c.get("allow") or ()),
                                 created_at=float(c.get("created_at") or 0.0))
                         for c in data.get("channels") or [])
        raw = data.get("defaults") or {}
        known = {k: v for k, v in raw.items() if k in Defaults.__dataclass_fields__}
        for key in ("triggers", "urgent"):
            if key in known:
                known[key] = tuple(known[key])
        return AlertSettings(channels=channels, defaults=Defaults(**known))

    def config_problems(self, wanted: tuple[str, ...]) -> list[str]:
        """What is wrong with a run config's ``alerts.channels`` (``wanted``) here: an id that
        names no channel (the channels there are listed), and a channel whose host an alert may
        not reach (one added before that was refused, or written by hand). What
        orchestrator/submission.py is given to judge a config with."""
        if not wanted:
            return []
        field = f"alerts.channels = {list(wanted)!r}"
        try:
            settings = self.load()
        except AlertsError as exc:
            return [f"{field}: {exc}"]
        known = {str(c.id): c for c in settings.channels}
        listed = "; ".join(f"{c.id}: {c.masked}" for c in settings.channels[:10])
        exist = f"the channels: {listed} (`runyard alerts ls`)" if listed else (
            "there are no channels yet (`runyard alerts add URL` adds one)")
        problems = [f"{field}: no channel {value}; {exist}" for value in wanted if value not in known]
        for value in dict.fromkeys(v for v in wanted if v in known):
            channel = known[value]
            try:
                check_url(channel.url, channel.allow)
            except RefusedValue as exc:
                problems.append(f"{field}: channel {value} cannot be used: {exc}; remove it (`runyard alerts rm "
                                f"{value}`) and add one that can")
        return problems

    @contextmanager
    def _locked(self) -> Iterator[AlertSettings]:
        """The settings, read under an exclusive lock on ``.alerts.json.lock`` (filelock's ``flock``,
        as the scheduler's and the migration's locks), held for the block."""
        from filelock import FileLock  # noqa: PLC0415 - only to write: ~0.1 s of imports that a reader need not pay

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(self.path.with_name(f".{ALERTS_FILE}.lock"), mode=0o600):
            yield self.load()

    def _save(self, settings: AlertSettings) -> None:
        data: dict[str, Any] = {"channels": [asdict(c) for c in settings.channels],
                                "defaults": asdict(settings.defaults)}
        tmp = self.path.with_name(f".{ALERTS_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    def add(self, url: str, on: tuple[str, ...] = (), secret: str | None = None,
            allow: tuple[str, ...] = ()) -> Channel:
        """Add a channel (a signed webhook gets a new secret unless one is given).

        Raises:
            RefusedValue: the URL, a trigger or the secret cannot be accepted (nothing is added).
        """
        check_url(url, tuple(allow))
        for name in on:
            problem = trigger_problem(name)
            if problem:
                raise RefusedValue(f"--on {name!r}: {problem}")
        signed = urlsplit(url).scheme in SIGNED_SCHEMES
        if secret is not None and not signed:
            raise RefusedValue("--secret is for runyard+https:// (runyard's signed webhook) channels only")
        if secret is not None and (problem := secret_problem(secret)):
            raise RefusedValue(problem)
        with self._locked() as settings:
            channel = Channel(id=max((c.id for c in settings.channels), default=0) + 1, url=url, on=tuple(on),
                              secret=(secret or secrets.token_hex(32)) if signed else None, allow=tuple(allow),
                              created_at=time.time())
            self._save(replace(settings, channels=(*settings.channels, channel)))
        return channel

    def remove(self, channel_id: int) -> Channel:
        with self._locked() as settings:
            gone = settings.channel(channel_id)
            self._save(replace(settings, channels=tuple(c for c in settings.channels if c.id != channel_id)))
        return gone

    def set_defaults(self, **changes: Any) -> Defaults:
        """Change the global defaults; every value is checked and a bad one named."""
        for key in changes:
            if key not in Defaults.__dataclass_fields__:
                raise RefusedValue(f"{key}: not an alert default (one of {', '.join(Defaults.__dataclass_fields__)})")
        for key in ("triggers", "urgent"):
            if key in changes:
                changes[key] = tuple(changes[key])
                for name in changes[key]:
                    problem = trigger_problem(name)
                    if problem:
                        raise RefusedValue(f"{key}: {name!r}: {problem}")
        problem = quiet_problem(changes.get("quiet_hours", "")) or ui_url_problem(changes.get("ui_url", ""))
        if problem:
            raise RefusedValue(problem)
        for key in ("repeat_s", "day_budget_usd"):
            if key in changes and not (isinstance(changes[key], (int, float)) and 0 <= changes[key] < float("inf")):
                raise RefusedValue(f"{key} = {changes[key]!r}: must be a number >= 0")
        with self._locked() as settings:
            defaults = replace(settings.defaults, **changes)
            self._save(replace(settings, defaults=defaults))
        return defaults
