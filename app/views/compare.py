"""Compare: overlay one metric of several runs (the mean over ranks, along each run's lineage).

Each run's metric comes from the metric store already downsampled (at most MAX_POINTS buckets
per rank), so a run of millions of points costs a few thousand rows here.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import charts, data

MAX_POINTS = 1000

st.title("Compare runs")
runs = data.list_runs()
if len(runs) < 1:
    st.info("No runs yet.")
    st.stop()
labels = {r["id"]: f"#{r['id']} {r['name']} ({r['status']})" for r in runs}
chosen = st.multiselect("Runs", list(labels), default=[r["id"] for r in runs[:2]], format_func=lambda i: labels[i])
keys = sorted({k for run_id in chosen for k in data.metric_keys(run_id)})
if not chosen or not keys:
    st.info("Pick runs that have reported metrics.")
    st.stop()
key = st.selectbox("Metric", keys, index=keys.index("loss") if "loss" in keys else 0)
if key is None:  # typed so for a select box without a choice; this one has keys and an index
    st.stop()
log_y = st.toggle("Log scale", value=False)

frames = []
for run_id in chosen:
    series = data.metric_series_full(run_id, key, MAX_POINTS)
    if not series.rows:
        continue
    mean = charts.rank_mean(series.rows, data.lineage_cutoffs(data.run_attempts(run_id)))
    frames.append(mean.assign(run=labels[run_id]))
if not frames:
    st.info(f"None of these runs reported {key!r}.")
    st.stop()
st.altair_chart(charts.runs_overlay(pd.concat(frames), key, log_y=log_y), width="stretch")
