"""Where an alert may go (orchestrator/alerts/hosts.py; issue 52, item 7).

Every spelling of a cloud metadata, link-local or unspecified address (one number, hexadecimal,
octal, short forms, IPv6 literals carrying an IPv4 address) is refused when a channel is added,
by ``runyard alerts add`` and Settings → Alerts alike (both call AlertStore.add), and again when
a channel is sent; a host without a dot that resolves to such an address is refused at the
lookup the send makes. A signed webhook's secret has a minimum length. Senders are real (Apprise,
runyard's webhook) against local receivers; lookups of made-up names are answered by a stand-in
resolver.
"""

from __future__ import annotations

import json
import socket

import pytest
from click.testing import CliRunner

from db.vocabulary.settings import Settings
from orchestrator.alerts import AlertsError
from orchestrator.alerts.channels import DeliveryError, Note, send
from orchestrator.alerts.store import AlertStore, Channel
from orchestrator.cli.group import cli
from tests.alert_receivers import http_receiver

METADATA = "169.254.169.254, a cloud metadata address"

SECRET_MIN_CHARS = 16  # orchestrator.alerts.store.SECRET_MIN_CHARS, as docs/ALERTS.md states it

# id, URL, what the refusal says
REFUSED = [
    ("one number", "json://2852039166/", f"2852039166 is {METADATA}"),
    ("hexadecimal", "json://0xA9FEA9FE/", f"0xA9FEA9FE is {METADATA}"),
    ("hexadecimal parts", "json://0xa9.0xfe.0xa9.0xfe/", f"0xa9.0xfe.0xa9.0xfe is {METADATA}"),
    ("octal parts", "runyard+http://0251.0376.0251.0376/hook", f"0251.0376.0251.0376 is {METADATA}"),
    ("short form", "json://169.254.43518/", f"169.254.43518 is {METADATA}"),
    ("trailing dot", "json://169.254.169.254./", "169.254.169.254. is a cloud metadata address"),
    ("IPv4-mapped IPv6", "json://[::ffff:169.254.169.254]/", "(169.254.169.254), a cloud metadata address"),
    ("IPv4-mapped IPv6 in hex", "json://[::ffff:a9fe:a9fe]/", "(169.254.169.254), a cloud metadata address"),
    ("NAT64", "json://[64:ff9b::a9fe:a9fe]/", "(169.254.169.254), a cloud metadata address"),
    ("AWS IPv6 metadata", "json://[fd00:ec2::254]/", "fd00:ec2::254 is a cloud metadata address"),
    ("ECS metadata", "json://169.254.170.2/", "a cloud metadata address"),
    ("link-local IPv4", "json://169.254.10.1/", "169.254.10.1 is a link-local address"),
    ("link-local IPv6 with a zone", "json://[fe80::1%25eth0]/", "is fe80::1, a link-local address"),
    ("unspecified IPv6", "json://[::]/", ":: is the unspecified address"),
    ("unspecified IPv4", "json://0.0.0.0/", "0.0.0.0 is the unspecified address"),
    ("unspecified in hex", "runyard+https://0x0/hook", "0x0 is 0.0.0.0, the unspecified address"),
    ("metadata name", "json://metadata.google.internal./", "is a cloud metadata name"),
    ("self-hosted ntfy", "ntfy://0xa9fea9fe/topic", f"0xa9fea9fe is {METADATA}"),
    ("gotify", "gotify://169.254.43518/token", f"169.254.43518 is {METADATA}"),
    ("email's smtp server", "mailto://me:pw@example.com?smtp=2852039166", f"2852039166 is {METADATA}"),
    ("signed webhook, one number", "runyard+http://2852039166/hook", f"2852039166 is {METADATA}"),
]

# Hosts that are tokens in the host's place, loopback in any spelling, and names: accepted.
ACCEPTED = ["slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ/#runs",
            "discord://1234567890123456789/abcdefTOKEN", "tgram://123456789:AAHabcdefghijklmnopqrstuvwxyz12345/1234",
            "json://2130706433:9/hook", "json://[::1]:9/hook", "json://hooks.example.com/hook",
            "mailto://me:pw@example.com?smtp=smtp.example.com"]


@pytest.mark.parametrize(("url", "said"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_alerts_add_refuses_every_spelling_of_a_refused_address(settings: Settings, url: str, said: str) -> None:
    runner = CliRunner()
    env = {"RUNYARD_HOME": str(settings.home)}
    added = runner.invoke(cli, ["alerts", "add", url], env=env)
    assert added.exit_code == 2, added.output
    (line,) = [line for line in added.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: channel URL ") and said.lower() in line.lower(), added.stderr
    assert "refused (allow it by name with --allow" in line
    assert json.loads(runner.invoke(cli, ["alerts", "ls", "--json"], env=env).output)["channels"] == []


def test_tokens_loopback_and_names_are_accepted_and_allow_lets_a_host_through(settings: Settings) -> None:
    store = AlertStore(settings.home)
    for url in ACCEPTED:
        store.add(url)
    allowed = store.add("json://2852039166/", allow=("2852039166",))
    assert [c.url for c in store.load().channels] == [*ACCEPTED, allowed.url]


def test_a_refused_channel_is_not_sent_to_whatever_the_host_spelling(settings: Settings) -> None:
    """A channel written before the check (an older runyard, or by hand) is refused when sent,
    before any connection: the spelling is read without a lookup."""
    for _, url, said in REFUSED:
        with pytest.raises(DeliveryError) as refused:
            send(Channel(id=1, url=url, secret="k" * SECRET_MIN_CHARS), Note("t", "b", {"run": None}))
        assert said.rsplit(" is ", 1)[-1] in str(refused.value), url


def dotless_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, str]) -> list[str]:
    """Lookups of the names in ``answers`` (made-up, without a dot) answered with their address;
    others as before. Returns the names looked up."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def resolver(host: str, port: object, *args: object, **kwargs: object) -> list:
        if host not in answers:
            return real(host, port, *args, **kwargs)  # type: ignore[arg-type]
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    return asked


def test_a_host_without_a_dot_is_checked_at_the_lookup_the_send_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = dotless_dns(monkeypatch, {"hookbox": "127.0.0.1", "imds": "169.254.169.254"})
    with http_receiver() as receiver:
        send(Channel(id=1, url=f"json://hookbox:{receiver.port}/hook"), Note("title", "body", {}))
        assert len(receiver.posts) == 1 and receiver.posts[0].json["message"] == "body"
        with pytest.raises(DeliveryError, match=f"imds resolves to {METADATA}; refused"):
            send(Channel(id=2, url=f"json://imds:{receiver.port}/hook"), Note("title", "body", {}))
        assert len(receiver.posts) == 1
    assert asked == ["hookbox", "imds"]  # Apprise's own lookups, checked as it made them


def test_a_signed_webhook_secret_has_a_minimum(settings: Settings) -> None:
    store = AlertStore(settings.home)
    short = f"--secret: 3 characters; a signing secret needs at least {SECRET_MIN_CHARS}"
    with pytest.raises(AlertsError, match=short):
        store.add("runyard+https://hooks.example.com/hook", secret="abc")  # noqa: S106 - a test key
    assert store.load().channels == ()
    assert store.add("runyard+https://hooks.example.com/hook", secret="s" * SECRET_MIN_CHARS).secret == "s" * 16
