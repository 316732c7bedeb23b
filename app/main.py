"""The runyard dashboard: ``runyard ui`` (or ``streamlit run app/main.py``).

Routes with st.navigation; the pages under app/views are thin: widgets, app.data, charts.
"""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from app import data, style
from orchestrator.format import duration, runyard_version

VERSION = runyard_version()
# The icon is a file served by the UI itself: a ":material/...:" icon would be fetched from Google's servers.
ICON = Path(__file__).resolve().parent / "assets" / "icon.png"
st.set_page_config(page_title="runyard", page_icon=str(ICON), layout="wide",
                   menu_items={"About": f"**runyard** {VERSION}: a dashboard and local job orchestrator for "
                                        "distributed PyTorch training."})


def logo_svg(version: str) -> str:
    """The product's name and version as an SVG the page draws itself (no font or image to fetch)."""
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="150" height="28" viewBox="0 0 150 28">'
        '<text x="0" y="20" font-family="sans-serif" font-size="18" font-weight="700" fill="#1f4e79">runyard</text>'
        f'<text x="78" y="20" font-family="sans-serif" font-size="13" fill="#6b7280">{version}</text></svg>'
    )


def sso_configured() -> bool:
    """Whether Streamlit's OIDC login is set up (an ``[auth]`` section in .streamlit/secrets.toml)."""
    try:
        return "auth" in st.secrets
    except Exception:  # noqa: BLE001 - no secrets file, or an unreadable one: no SSO
        return False


# Behind the token gate (app/server/gate.py), Streamlit's own single sign-on when the person set it up.
if sso_configured() and not st.user.get("is_logged_in", False):
    st.title("runyard")
    st.write("This dashboard uses your organisation's sign-in.")
    st.button("Log in", on_click=st.login, type="primary")
    st.stop()

pages = [
    st.Page("views/runs.py", title="Runs", icon=":material/list:", url_path="runs", default=True),
    st.Page("views/new_run.py", title="New run", icon=":material/add_circle:", url_path="new"),
    st.Page("views/run.py", title="Run", icon=":material/monitoring:", url_path="run"),
    st.Page("views/compare.py", title="Compare", icon=":material/stacked_line_chart:", url_path="compare"),
    st.Page("views/sweeps.py", title="Sweeps", icon=":material/tune:", url_path="sweeps"),
    st.Page("views/new_sweep.py", title="New sweep", icon=":material/add_chart:", url_path="new-sweep"),
    st.Page("views/sweep.py", title="Sweep", icon=":material/scatter_plot:", url_path="sweep"),
    st.Page("views/settings.py", title="Settings", icon=":material/settings:", url_path="settings"),
]
# Navigation across the top: the whole width is the page's (at 800 px a sidebar took 300 of it and
# cut the headline numbers to "$…"), and narrow windows fold the links into a menu.
page = st.navigation(pages, position="top")
st.logo(logo_svg(VERSION), size="large", link=None)


@st.fragment(run_every=5)
def scheduler_banner() -> None:
    if viewing := data.read_only_reason():
        st.info(f"**Viewing only**: {viewing}.", icon=":material/visibility:")
        return  # no scheduler writes here: its state does not matter
    status = data.scheduler_status()
    if status["online"] and status.get("db_error"):
        since = f" for {duration(time.time() - status['db_error_since'])}" if status.get("db_error_since") else ""
        st.error(
            f"**The scheduler cannot write the database**{since} ({style.plain(status['db_error'])}): runs are "
            "not being updated and no run starts. Free space on the disk that holds the data folder (a full disk "
            "is the usual cause); the scheduler goes on by itself once it can write again.",
            icon=":material/database_off:",
        )
    elif not status["online"]:
        seen = f"last heartbeat {duration(status['age_s'])} ago" if status["age_s"] is not None else "never seen"
        st.warning(
            f"**Scheduler offline** ({seen}): queued runs will not start. "
            "Start it with `runyard scheduler` (or `runyard up`).",
            icon=":material/warning:",
        )


scheduler_banner()
page.run()
