"""Settings' Alerts part in a real browser: a person adds a channel (an Apprise ``json://`` URL of
a local HTTP receiver, standing in for Slack or ntfy, which cannot be reached from here), sees it
masked in the list, presses Test, and the message arrives and is shown as delivered."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.alert_receivers import http_receiver
from tests.browser.test_ui_browser import PAGE_TIMEOUT_MS, expect, open_page

pytestmark = pytest.mark.browser


def test_a_channel_added_in_settings_is_masked_and_its_test_message_arrives(page: Any, runyard_up: Any) -> None:
    open_page(page, f"{runyard_up.url}/settings", "Settings")
    expect(page.get_by_text("No channels yet: add one below.")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    with http_receiver() as receiver:
        url = receiver.url("json", "/hook?secret-part=s3cr3t")
        page.get_by_label("Channel URL").fill(url)
        page.get_by_role("button", name="Add channel").click()
        expect(page.get_by_text("Channel 1 added:")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
        expect(page.get_by_role("button", name="Test")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
        assert "s3cr3t" not in page.content()  # masked on the page, as in the CLI and the logs

        page.get_by_role("button", name="Test").click()
        expect(page.get_by_text("channel 1").filter(has_text="delivered")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
        assert len(receiver.posts) == 1 and receiver.posts[0].path.startswith("/hook")
        assert "runyard test message" in json.dumps(receiver.posts[0].json)
    # The channel the page added is the one the CLI lists, masked there too.
    (listed,) = runyard_up.cli("alerts", "ls")["channels"]
    assert listed["id"] == 1 and listed["url"].startswith("json://127.0.0.1:") and "s3cr3t" not in listed["url"]
