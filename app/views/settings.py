"""Settings: the price table that cost estimates use (a run keeps the price it was submitted
with, so editing here does not rewrite the cost of past runs), and the alert channels and defaults."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import data, style
from app.alerts_panel import alerts_settings
from db.vocabulary.cost import price_for

style.apply()

st.title("Settings")
st.subheader("Prices (USD per hour)")
st.caption(
    "Per GPU-hour by GPU model (matched against the name NVML reports; the longest match wins), "
    "`other GPU` for models not listed, and `cpu-node` for a whole CPU machine (a run pays its "
    "share of the slots). Defaults are public on-demand list prices, rounded."
)
prices = data.prices()
table = pd.DataFrame(sorted(prices.items()), columns=["device", "usd_per_hour"])
machine = data.inventory()
one = price_for(1, machine, prices)
st.info(f"**This machine**: {machine.slots} x {machine.device_label}. A 1-rank run costs "
        f"${one.usd_per_hour:.4g}/h ({one.unit}); a run with all {machine.slots} costs "
        f"${one.usd_per_hour * machine.slots:.4g}/h.", icon=":material/calculate:")
# Tall enough for every row (35 px each, plus the header and the row for adding one): no inner scroll.
edited = st.data_editor(
    table, num_rows="dynamic", hide_index=True, key="prices", height=35 * (len(table) + 2) + 3,
    column_config={"usd_per_hour": st.column_config.NumberColumn("USD per hour", min_value=0.0, format="%.2f")},
)
if st.button("Save prices", type="primary", icon=":material/save:", disabled=data.read_only_reason() is not None,
             help=data.read_only_reason()):
    rows = edited.dropna(subset=["device"])
    message = data.save_prices({str(d): float(p) for d, p in zip(rows["device"], rows["usd_per_hour"], strict=True)})
    if message:
        st.error(style.plain(message))
    else:
        st.success("Saved. New runs use these prices; submitted runs keep theirs.")

alerts_settings()  # alerts (app/alerts_panel.py)
