"""The Run page's system section: GPUs, the run's processes per rank, and the host.

``system_panels(run_id)`` draws it from the scheduler's 10-s aggregates (``system_metrics``,
written by orchestrator/scheduler/sysmon.py): each chart shows the mean as a line and the min-max range
of each window as a band, its axis titled and scaled by the metric registry (db/vocabulary/metric_registry.py:
"GPU utilization (%)", "Memory used (GiB)"). Data comes through the cached functions below (plain DataFrames), the
charts from the plain builders below them; no SQL here.
"""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from app import data, style
from app.charts.metric import unvalidated
from db import sysmetrics
from db.vocabulary import metric_registry as registry
from orchestrator.format import clock

# Points per series a chart gets at most: longer runs are merged into coarser buckets on the
# server (Altair refuses more than 5000 rows, and 16 series of memory used/total must fit).
MAX_POINTS = 240
GIB = 2**30

COLUMNS = ["at", "host", "device", "run_id", "rank", "key", "min", "mean", "max", "count"]


# -- data (cached, plain) --------------------------------------------------------------------


def bucket_for(span_s: float) -> float | None:
    """The bucket length that keeps a series of ``span_s`` seconds under MAX_POINTS points."""
    if span_s <= MAX_POINTS * sysmetrics.WINDOW_S:
        return None
    return math.ceil(span_s / MAX_POINTS / sysmetrics.WINDOW_S) * sysmetrics.WINDOW_S


@st.cache_data(ttl=5.0, show_spinner=False)
def system_frames(run_id: int) -> dict[str, Any]:
    """The run's rows (processes, GPUs), the host rows while it ran, and its GPUs."""
    with data.sessions()() as s:
        span = sysmetrics.run_span(s, run_id)
        if span is None:
            return {"run": pd.DataFrame(columns=COLUMNS), "host": pd.DataFrame(columns=COLUMNS), "gpus": []}
        bucket_s = bucket_for(span[1] - span[0])
        run_rows = sysmetrics.system_series(s, run_id=run_id, bucket_s=bucket_s)
        host_rows = sysmetrics.system_series(s, run_id=run_id, host_only=True, bucket_s=bucket_s)
        gpus = sysmetrics.gpu_devices(s, run_id)
    return {
        "run": pd.DataFrame(run_rows, columns=COLUMNS),
        "host": pd.DataFrame(host_rows, columns=COLUMNS),
        "gpus": gpus,
    }


# -- chart builders ---------------------------------------------------------------------------


def _prepare(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """Rows with a ``time`` column and the values in the registry's displayed unit of ``key``."""
    out = frame.assign(time=pd.to_datetime(frame["at"], unit="s"))
    for column in ("min", "mean", "max"):
        out[column] = out[column].astype(float) * registry.spec_for(key).scale
    return out


def band_line(frame: pd.DataFrame, title: str, key: str, y_title: str | None = None) -> alt.LayerChart | None:
    """One mean line per ``series`` with its min-max band, against time (None without rows); the
    y axis in ``key``'s unit and titled by the registry unless ``y_title`` is given."""
    if frame.empty:
        return None
    df = _prepare(frame, key)
    y_title = y_title or registry.axis_title(key)
    fmt = registry.d3_format(key)
    base = alt.Chart(df, title=title).encode(
        x=alt.X("time:T", title="time"),
        color=alt.Color("series:N", title=None),
    )
    band = base.mark_area(opacity=0.18).encode(y=alt.Y("min:Q", title=y_title), y2="max:Q")
    line = base.mark_line().encode(
        y=alt.Y("mean:Q", title=y_title),
        tooltip=["series", alt.Tooltip("time:T", format="%H:%M:%S"),
                 alt.Tooltip("mean:Q", format=fmt), alt.Tooltip("min:Q", format=fmt),
                 alt.Tooltip("max:Q", format=fmt)],
    )
    return alt.layer(band, line).properties(height=220)


def used_vs_total(frame: pd.DataFrame, title: str, key: str, y_title: str) -> alt.Chart | None:
    """Used against the total or limit (the mean of each window) per ``series``, one dash
    style per ``what``, in ``key``'s unit (None without rows)."""
    if frame.empty:
        return None
    df = _prepare(frame, key)
    fmt = registry.d3_format(key)
    return (
        alt.Chart(df, title=title)
        .mark_line()
        .encode(
            x=alt.X("time:T", title="time"),
            y=alt.Y("mean:Q", title=y_title),
            color=alt.Color("series:N", title=None),
            strokeDash=alt.StrokeDash("what:N", title=None),
            detail="what:N",
            tooltip=["series", "what", alt.Tooltip("time:T", format="%H:%M:%S"),
                     alt.Tooltip("mean:Q", format=fmt), alt.Tooltip("max:Q", format=fmt)],
        )
        .properties(height=220)
    )


def _pair(frame: pd.DataFrame, used: str, total: str, used_label: str, total_label: str) -> pd.DataFrame:
    picked = frame[frame["key"].isin([used, total])]
    return picked.assign(what=picked["key"].map({used: used_label, total: total_label}))


# -- panels -----------------------------------------------------------------------------------


def gpu_panel(frame: pd.DataFrame, gpus: list[dict[str, Any]]) -> None:
    """Per GPU: utilization, memory used vs total, power vs limit, temperature, SM clock."""
    multi_host = len({g["host"] for g in gpus}) > 1
    labels = {
        (g["host"], g["device"]): (f"{g['host']} " if multi_host else "") + g["device"]
        + (f" · rank {g['rank']}" if g["rank"] is not None else "")
        for g in gpus
    }
    df = frame.assign(series=[labels.get((h, d), d) for h, d in zip(frame["host"], frame["device"], strict=True)])
    _grid([
        band_line(df[df["key"] == "util_percent"], "GPU utilization", "util_percent"),
        used_vs_total(_pair(df, "mem_used_bytes", "mem_total_bytes", "used", "total"), "GPU memory",
                      "mem_used_bytes", f"Memory ({registry.unit('mem_used_bytes')})"),
        used_vs_total(_pair(df, "power_w", "power_limit_w", "power", "limit"), "GPU power", "power_w",
                      registry.axis_title("power_w")),
        band_line(df[df["key"] == "temp_c"], "GPU temperature", "temp_c"),
        band_line(df[df["key"] == "sm_clock_mhz"], "SM clock", "sm_clock_mhz"),
    ])
    ecc = df[(df["key"] == "ecc_uncorrected") & (df["max"] > 0)]
    for series, errors in ecc.groupby("series")["max"].max().items():
        st.warning(f"{style.plain(series)}: {errors:.0f} volatile uncorrected ECC error(s) since the driver loaded.",
                   icon=":material/memory:")


def process_panel(frame: pd.DataFrame) -> None:
    """The run's processes: CPU % and RSS of each rank, and of the whole tree."""
    df = frame[frame["device"] == "procs"]
    if df.empty:
        st.caption("No process samples for this run.")
        return
    df = df.assign(series=["all processes" if pd.isna(r) else f"rank {int(r)}" for r in df["rank"]])
    _grid([
        band_line(df[df["key"] == "cpu_percent"], "Process CPU", "cpu_percent", "CPU (% of one core)"),
        band_line(df[df["key"] == "rss_bytes"], "Process memory (RSS)", "rss_bytes"),
    ])


def host_panel(frame: pd.DataFrame) -> None:
    """The machine while the run ran: CPU, memory, disk and network."""
    if frame.empty:
        st.caption("No host samples while this run ran.")
        return
    multi_host = frame["host"].nunique() > 1
    names = {"disk_read_bps": "read", "disk_write_bps": "write", "net_sent_bps": "sent", "net_recv_bps": "received",
             "cpu_percent": "host", "mem_used_bytes": "host", "mem_total_bytes": "host"}
    df = frame[frame["key"].isin(names)]
    df = df.assign(series=[f"{h} {names[k]}" if multi_host else names[k]
                           for k, h in zip(df["key"], df["host"], strict=True)])
    mem = _pair(df, "mem_used_bytes", "mem_total_bytes", "used", "total")
    _grid([
        band_line(df[df["key"] == "cpu_percent"], "Host CPU", "cpu_percent", "CPU (% of all cores)"),
        used_vs_total(mem, "Host memory", "mem_used_bytes", f"Memory ({registry.unit('mem_used_bytes')})"),
        band_line(df[df["key"].str.startswith("disk_")], "Disk", "disk_read_bps",
                  f"Read / write ({registry.unit('disk_read_bps')})"),
        band_line(df[df["key"].str.startswith("net_")], "Network", "net_sent_bps",
                  f"Sent / received ({registry.unit('net_sent_bps')})"),
    ])


def _grid(charts: list[alt.Chart | alt.LayerChart | None]) -> None:
    """Two charts a row; charts without data (None) are left out."""
    drawn = [c for c in charts if c is not None]
    if not drawn:
        return
    cols = st.columns(2)
    for i, chart in enumerate(drawn):
        with cols[i % 2]:
            st.altair_chart(unvalidated(chart), width="stretch")


@st.cache_data(ttl=5.0, show_spinner=False)
def latest_window(run_id: int) -> dict[str, Any] | None:
    with data.sessions()() as s:
        return sysmetrics.latest_window(s, run_id)


def summary_line(latest: dict[str, Any] | None) -> str:
    """One line for the run's newest 10-s window: GPUs, processes, host."""
    if latest is None:
        return "No system samples for this run yet: the scheduler writes them every 10 s while its processes are alive."
    parts = []
    if latest["gpus"] and latest["gpu_util_percent"] is not None:
        mem = ""
        if latest["gpu_mem_used_bytes"] is not None and latest["gpu_mem_total_bytes"]:
            mem = f", memory {latest['gpu_mem_used_bytes'] / GIB:.1f} / {latest['gpu_mem_total_bytes'] / GIB:.0f} GiB"
        parts.append(f"GPU utilization {latest['gpu_util_percent']:.0f}%{mem} (mean of {latest['gpus']} GPU(s))")
    if latest["procs_cpu_percent"] is not None:
        rss = f", {latest['procs_rss_bytes'] / GIB:.1f} GiB RSS" if latest["procs_rss_bytes"] is not None else ""
        parts.append(f"processes {latest['procs_cpu_percent']:.0f}% of one core{rss}")
    if latest["host_cpu_percent"] is not None:
        parts.append(f"host CPU {latest['host_cpu_percent']:.0f}%")
    return f"Newest 10-s window (from {clock(latest['at'])}): " + "; ".join(parts or ["nothing sampled"]) + "."


def system_panels(run_id: int) -> None:
    """The Run page's system charts for ``run_id``, under its System heading and summary line
    (views/run.py's ``system_section``; a plain function: call it inside the page's live
    fragment). A run without GPU rows gets an ``st.info`` saying so, not an error."""
    frames = system_frames(run_id)
    run_rows, host_rows, gpus = frames["run"], frames["host"], frames["gpus"]
    if run_rows.empty and host_rows.empty:
        st.caption("No system samples for this run yet: the scheduler writes them every 10 s "
                   "while the run's processes are alive.")
    gpu_rows = run_rows[run_rows["device"].str.startswith("gpu")] if not run_rows.empty else run_rows
    if gpu_rows.empty:
        st.info("This run has no GPU metrics: it ran on CPU, or NVML (nvidia-ml-py and an NVIDIA "
                "driver) was not available to the scheduler.", icon=":material/memory:")
    else:
        st.markdown("**GPUs**")
        gpu_panel(gpu_rows, gpus)
    if not run_rows.empty:
        st.markdown("**Processes**")
        process_panel(run_rows)
    if not host_rows.empty:
        st.markdown("**Host**")
        host_panel(host_rows)
