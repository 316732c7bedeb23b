"""Alerts in the UI: the Settings page's Alerts part (channels, Test, defaults), a run's alerts
with their delivery state (Run page), and which runs have an open alert (Runs list).

Channel URLs are shown masked only; their secrets stay in ``alerts.json`` (orchestrator/alerts/store.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd
import streamlit as st

from app import data, style
from db.vocabulary.config import TRIGGERS
from orchestrator.alerts import AlertsError
from orchestrator.alerts.engine import history, open_alert_runs, send_test
from orchestrator.alerts.store import AlertStore, off_by_default_note

OPEN_MARK = "!"  # plain text: the grid draws an emoji as a missing-glyph box where no emoji font is installed


def store() -> AlertStore:
    return AlertStore(data.settings().home)


@st.cache_data(ttl=2.0, show_spinner=False)
def open_alerts() -> dict[int, list[str]]:
    """Runs with an open alert, and those alerts' triggers; empty when the database cannot tell."""
    try:
        with data.sessions()() as s:
            return open_alert_runs(s)
    except Exception:  # noqa: BLE001 - a database from before alerts (read-only, not migrated): no marks
        return {}


def alert_mark(run_id: int, marks: dict[int, list[str]]) -> str:
    """The Runs list's cell: ``! failed`` for a run with an open alert, else empty."""
    triggers = marks.get(run_id)
    return f"{OPEN_MARK} {', '.join(sorted(set(triggers)))}" if triggers else ""


@st.cache_data(ttl=2.0, show_spinner=False)
def run_history(run_id: int | None, limit: int = 100) -> list[dict[str, Any]]:
    try:
        with data.sessions()() as s:
            return history(s, run_id, limit)
    except Exception:  # noqa: BLE001 - a database from before alerts: nothing to show
        return []


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "–"


def delivery_state(deliveries: list[dict[str, Any]]) -> str:
    """``delivered 2, failed 1 (HTTP 500)``: each outcome counted, the last error named."""
    if not deliveries:
        return "no channel"
    counts: dict[str, int] = {}
    for d in deliveries:
        counts[d["status"]] = counts.get(d["status"], 0) + 1
    text = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    errors = [d["error"] for d in deliveries if d["status"] == "failed" and d["error"]]
    return f"{text} ({errors[-1]})" if errors else text


def run_alerts(run_id: int) -> None:
    """The run's alerts, newest first, with each one's delivery state (the Run page)."""
    rows = run_history(run_id)
    if not rows:
        return
    opened = sum(1 for a in rows if a["state"] == "open")
    title = f"Alerts ({len(rows)}{f', {opened} open' if opened else ''})"
    with st.expander(title, expanded=bool(opened)):
        st.dataframe(pd.DataFrame([{
            "opened": _when(a["opened_at"]), "trigger": a["trigger"], "state": a["state"],
            "repeats": a["repeats"], "delivery": delivery_state(a["deliveries"]), "message": a["message"],
        } for a in rows]), hide_index=True, width="stretch")


def alerts_settings() -> None:
    """The Settings page's Alerts part."""
    st.subheader("Alerts")
    st.caption("Where runyard tells you about your runs: any Apprise URL (slack://, discord://, ntfy://, "
               "mailto://, json://...) or runyard+https://HOST/PATH, runyard's signed webhook. URLs are kept "
               "in alerts.json (mode 0600) and shown masked. See docs/ALERTS.md.")
    readonly = data.read_only_reason()
    try:
        store().load()
    except AlertsError as exc:
        st.error(style.plain(str(exc)))
        return
    listing = st.container()  # filled below the form, so that a channel just added is listed
    with st.form("alert_add", clear_on_submit=True, border=False):
        c1, c2 = st.columns([3, 2])
        url = c1.text_input("Channel URL", placeholder="ntfy://ntfy.sh/my-runs", key="alert_url", type="password")
        on = c2.multiselect("Only these triggers", TRIGGERS, placeholder="every enabled trigger", key="alert_on",
                            help="Sent to this channel even when the defaults leave them off; the other "
                                 "channels follow the defaults.")
        if st.form_submit_button("Add channel", icon=":material/add:", disabled=readonly is not None):
            try:
                channel = store().add(url.strip(), on=tuple(on))
            except AlertsError as exc:
                st.error(style.plain(str(exc)))
            else:
                st.success(f"Channel {channel.id} added: {channel.masked}")
                if note := off_by_default_note(channel, store().load().defaults):
                    st.info(style.plain(note[0].upper() + note[1:]))
                if channel.signed:
                    st.code(channel.secret or "", language=None)
                    st.caption("The webhook's signing secret (shown once here; `runyard alerts ls` masks it).")
    settings = store().load()  # with the channel the form may just have added: Test it at once
    with listing:
        if settings.channels:
            st.dataframe(pd.DataFrame([{"id": c.id, "channel": c.masked,
                                        "on": ", ".join(c.on) or "every enabled trigger", "signed": c.signed}
                                       for c in settings.channels]),
                         hide_index=True, width="stretch", key="alert_channels")
        else:
            st.info("No channels yet: add one below.")
    if settings.channels:
        c1, c2, c3 = st.columns([2, 1, 1], vertical_alignment="bottom")
        chosen = int(c1.selectbox("Channel", [c.id for c in settings.channels], key="alert_channel",
                                  format_func=lambda i: f"{i}: {settings.channel(i).masked}") or 0)
        if c2.button("Test", icon=":material/send:", key="alert_test", disabled=readonly is not None):
            for row in send_test(data.sessions(), data.settings().home, [chosen]):
                text = f"channel {row.channel_id} {row.channel}: {row.status}" + (f": {row.error}" if row.error else "")
                (st.success if row.status == "delivered" else st.error)(style.plain(text))
            run_history.clear()
        if c3.button("Remove", icon=":material/delete:", key="alert_rm", disabled=readonly is not None):
            gone = store().remove(chosen)
            st.success(f"Channel {gone.id} removed")
            st.rerun()
    defaults_form(readonly)
    recent = [d for a in run_history(None, 20) for d in a["deliveries"]]
    if recent:
        with st.expander(f"Recent alert deliveries ({len(recent)})"):
            st.dataframe(pd.DataFrame([{"at": _when(d["created_at"]), "channel": d["channel"], "kind": d["kind"],
                                        "trigger": d["trigger"], "status": d["status"], "tries": d["tries"],
                                        "error": d["error"] or ""} for d in recent]), hide_index=True, width="stretch")


def defaults_form(readonly: str | None) -> None:
    current = store().load().defaults
    with st.form("alert_defaults", border=False):
        st.markdown("**Defaults** (a run's `[alerts]` changes them for that run)")
        triggers = st.multiselect("Triggers on by default", TRIGGERS, default=list(current.triggers),
                                  key="alert_default_triggers")
        c1, c2, c3 = st.columns(3)
        repeat_s = c1.number_input("Repeat a still-true alert after (s)", min_value=0.0, value=float(current.repeat_s),
                                   step=600.0, key="alert_repeat")
        quiet = c2.text_input("Quiet hours (HH:MM-HH:MM)", value=current.quiet_hours, key="alert_quiet")
        budget = c3.number_input("Day's budget (USD, 0: none)", min_value=0.0, value=float(current.day_budget_usd),
                                 key="alert_day_budget")
        ui_url = st.text_input("UI address for links", value=current.ui_url, placeholder="from ui.json",
                               key="alert_ui_url")
        if st.form_submit_button("Save defaults", icon=":material/save:", disabled=readonly is not None):
            try:
                store().set_defaults(triggers=triggers, repeat_s=float(repeat_s), quiet_hours=quiet.strip(),
                                     day_budget_usd=float(budget), ui_url=ui_url.strip())
            except AlertsError as exc:
                st.error(style.plain(str(exc)))
            else:
                st.success("Saved: the scheduler uses them from its next alert pass.")
