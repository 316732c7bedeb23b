"""Sending to a channel (orchestrator/alerts/channels.py): a webhook's host is resolved once and
the send pinned to that address (DNS rebinding: mlflow#24179), Apprise's generic webhooks too.
"""

from __future__ import annotations

import socket

import pytest

from orchestrator.alerts.channels import DeliveryError, Note, resolve, send, send_signed
from orchestrator.alerts.store import Channel
from tests.alert_receivers import http_receiver


def rebinding_dns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """DNS rebinding cannot be staged here without a resolver of our own: lookups of
    ``hooks.rebind.test`` are answered by a stand-in that gives 127.0.0.1 first and the metadata
    address after that (other names resolve as before). Returns the list of its lookups."""
    real = socket.getaddrinfo
    calls: list[str] = []

    def rebinding(host: str, port: object, *args: object, **kwargs: object) -> list:
        if host != "hooks.rebind.test":
            return real(host, port, *args, **kwargs)  # type: ignore[arg-type]
        calls.append(host)
        address = "127.0.0.1" if len(calls) == 1 else "169.254.169.254"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    return calls


def test_webhook_target_resolved_once_pinned_and_metadata_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DeliveryError, match="cloud metadata address"):
        resolve("169.254.169.254", 80)
    with pytest.raises(DeliveryError, match="link-local"):
        resolve("169.254.10.1", 80)
    with pytest.raises(DeliveryError, match="link-local"):
        resolve("fe80::1", 80)
    assert resolve("169.254.169.254", 80, allow=("169.254.169.254",)) == "169.254.169.254"
    calls = rebinding_dns(monkeypatch)
    with http_receiver() as receiver:
        url = f"runyard+http://hooks.rebind.test:{receiver.port}/hook"
        channel = Channel(id=1, url=url, secret="k")  # noqa: S106 - a test key
        send_signed(channel, Note("t", "b", {"run": None, "trigger": "test"}))
        assert len(receiver.posts) == 1 and receiver.posts[0].headers["Host"].startswith("hooks.rebind.test")
    assert calls == ["hooks.rebind.test"]  # resolved once; the connection went to that address
    with pytest.raises(DeliveryError, match="cloud metadata address"):
        send_signed(channel, Note("t", "b", {}))


def test_an_apprise_webhook_is_pinned_to_the_address_it_was_checked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apprise's generic webhooks (json://, form://, xml://) re-resolve the name in their own HTTP
    client, from a thread of Apprise's; the send pins it to the address the check saw."""
    real = socket.getaddrinfo
    calls = rebinding_dns(monkeypatch)
    with http_receiver() as receiver:
        channel = Channel(id=1, url=f"json://hooks.rebind.test:{receiver.port}/hook")
        send(channel, Note("title", "body", {}))
        assert len(receiver.posts) == 1 and receiver.posts[0].headers["Host"].startswith("hooks.rebind.test")
        assert receiver.posts[0].json["message"] == "body"
    assert calls == ["hooks.rebind.test"]  # resolved once, by the check; the send went to that address
    assert socket.getaddrinfo("localhost", 80) == real("localhost", 80)  # outside a send, lookups as before
    with pytest.raises(DeliveryError, match="cloud metadata address"):  # the next send's check sees the rebind
        send(channel, Note("title", "body", {}))
