"""Each person's panel layout, kept across browser sessions: who the person is, their layout read
once per browser session and every change written to the database at once
(db/workspace/layouts.py, one row per person).

Who the person is: with ``--auth proxy``, the user the reverse proxy authenticated (the gate has
checked the proxy's secret; app/server/asgi.py maps its user header into ``st.user``); with
Streamlit's single sign-on, the signed-in e-mail; otherwise the owner of the data folder (a token
UI is one person's: everyone holding its token is its owner). A data folder that cannot be written
(a viewer) keeps the changes for the browser session only, and so does a change made while the
stored layout cannot be read (saving then would put the defaults over the person's layout)."""

from __future__ import annotations

import getpass
import logging
import os
import pwd
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from app import data
from app.server.asgi import PROXY_USER_KEY
from db.workspace.layouts import Layout, read_layout, save_layout

logger = logging.getLogger(__name__)

LAYOUT_KEY = "panel-layout"  # this browser session's copy of the person's layout
PERSON_KEY = "panel-person"


def _user(name: str) -> Any:
    try:
        return st.user.get(name)
    except Exception:  # noqa: BLE001 - no user information in this context (a test's AppTest, a bare script)
        return None


def _user_field(name: str) -> str | None:
    value = _user(name)
    return value.strip() if isinstance(value, str) and value.strip() else None


def folder_owner() -> str:
    """The account that owns the data folder (else the one the UI runs as; a uid without a passwd
    entry and no LOGNAME or USER, as in ``docker run -u 1234``, by its number: "uid 1234")."""
    try:
        return pwd.getpwuid(data.settings().home.stat().st_uid).pw_name
    except (KeyError, OSError):
        pass
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # KeyError up to Python 3.12, OSError from 3.13
        return f"uid {os.getuid()}"


def person() -> str:
    """Whom this browser session's layout belongs to: the proxy's user, the single sign-on's
    e-mail, else the data folder's owner."""
    if PERSON_KEY not in st.session_state:
        signed_in = _user_field("email") if _user("is_logged_in") is True else None
        st.session_state[PERSON_KEY] = _user_field(PROXY_USER_KEY) or signed_in or folder_owner()
    who: str = st.session_state[PERSON_KEY]
    return who


def _stored() -> Layout | None:
    """The person's stored layout; None when the database cannot be read now (the page's own
    reads say so; the log has why)."""
    try:
        with data.sessions()() as s:
            return read_layout(s, person())
    except SQLAlchemyError:
        logger.warning("the panel layout of %s cannot be read", person(), exc_info=True)
        return None


def current() -> Layout:
    """The person's layout: read from the database once per browser session (the defaults when it
    cannot be read then)."""
    if LAYOUT_KEY not in st.session_state:
        st.session_state[LAYOUT_KEY] = _stored() or Layout()
    layout: Layout = st.session_state[LAYOUT_KEY]
    return layout


def update(change: Callable[[Layout], Layout]) -> Layout:
    """Apply ``change`` to the person's stored layout (read again first: another tab of theirs
    may have changed another part) and keep it, in the database and in this session. When the
    stored layout cannot be read, the change applies to this session's and is not saved: saving
    it would put this session's layout (perhaps the defaults) over every other part they kept."""
    writable = data.read_only_reason() is None
    stored = _stored() if writable else None
    layout = change(current() if stored is None else stored)
    st.session_state[LAYOUT_KEY] = layout
    if writable and stored is None:
        logger.warning("the panel layout of %s is kept for this browser session, not saved: its stored layout "
                       "could not be read", person())
    elif writable:
        try:
            with data.sessions()() as s:
                save_layout(s, person(), layout)
                s.commit()
        except SQLAlchemyError:  # kept for this session; the next change tries again
            logger.warning("the panel layout of %s cannot be saved", person(), exc_info=True)
    return layout


def set_open(section: str, is_open: bool) -> None:
    update(lambda layout: replace(layout, sections={**layout.sections, section: is_open}))


def set_full(key: str | None) -> None:
    update(lambda layout: replace(layout, full=key))
