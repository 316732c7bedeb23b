"""Small formatting helpers shared by the pages."""

from __future__ import annotations

import datetime as dt

STATUS_BADGE = {
    "QUEUED": ("gray", ":material/schedule:"),
    "STARTING": ("blue", ":material/rocket_launch:"),
    "RUNNING": ("blue", ":material/play_arrow:"),
    "RETRYING": ("orange", ":material/refresh:"),
    "CANCELLING": ("orange", ":material/stop_circle:"),
    "SUCCEEDED": ("green", ":material/check_circle:"),
    "FAILED": ("red", ":material/error:"),
    "CANCELLED": ("gray", ":material/cancel:"),
}


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


def clock(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else "–"


def badge(status: str) -> str:
    color, icon = STATUS_BADGE.get(status, ("gray", ""))
    return f":{color}-badge[{icon} {status}]"


def usd(x: float | None) -> str:
    if x is None:
        return "–"
    return f"${x:,.4f}" if x < 1 else f"${x:,.2f}"


def step_text(step: int, total: int | None, sep: str = "/") -> str:
    """``12/300``; just ``12`` when the total is not known (0: a script that gave none)."""
    return f"{step}{sep}{total}" if total else f"{step}"
