"""What every page shows first (app/main.py): the scheduler banner, and the sign-in where single
sign-on is configured.
"""

from __future__ import annotations

import re
import time

from sqlalchemy.orm import Session, sessionmaker

from db.vocabulary.settings import Settings
from tests.unit.app.pages import add_heartbeat, no_exception, seeded, sessions, settings
from tests.unit.apptest import new_app

__all__ = ["seeded", "sessions", "settings"]  # the fixtures, from the helper module


# -- scheduler banner -----------------------------------------------------------------------


def test_stale_heartbeat_shows_scheduler_offline(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        add_heartbeat(s, age_s=60.0)
        s.commit()
    started = time.monotonic()
    at = new_app().run()
    waited = time.monotonic() - started
    no_exception(at)
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1
    assert "Scheduler offline" in warnings[0]
    # The age the banner gives is the heartbeat's, counted when the page drew: 60 s plus however
    # long the page took to draw (a loaded machine takes a second or two).
    seen = re.search(r"last heartbeat 1m (\d\d)s ago", warnings[0])
    assert seen and 0 <= int(seen.group(1)) <= 1 + waited, warnings[0]


def test_no_heartbeat_ever_shows_scheduler_offline(settings: Settings) -> None:
    at = new_app().run()
    assert any("Scheduler offline" in w.value and "never seen" in w.value for w in at.warning)


def test_fresh_heartbeat_shows_no_banner(seeded: dict[str, int]) -> None:
    at = new_app().run()
    no_exception(at)
    assert not any("Scheduler offline" in w.value for w in at.warning)


# -- single sign-on -------------------------------------------------------------------------


def test_with_oidc_configured_the_pages_wait_for_the_sign_in(seeded: dict[str, int]) -> None:
    at = new_app()
    at.secrets["auth"] = {"redirect_uri": "http://127.0.0.1:8501/oauth2callback", "cookie_secret": "x" * 32,
                          "client_id": "runyard", "client_secret": "s",
                          "server_metadata_url": "https://id.example/.well-known/openid-configuration"}
    at.run()
    no_exception(at)
    assert [b.label for b in at.button] == ["Log in"]
    assert not at.dataframe  # no run is shown before the sign-in


def test_without_oidc_the_pages_show_at_once(seeded: dict[str, int]) -> None:
    at = new_app().run()
    no_exception(at)
    assert "Log in" not in [b.label for b in at.button]
    assert at.dataframe
