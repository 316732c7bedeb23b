"""Settings: your own cost (the ``[cost]`` table of ``settings.toml``: your tariff, PUE and
hardware, which price every run your way), the cloud reference's price table (a run keeps the price
it was submitted with, so editing it does not rewrite the cost of past runs), and the alert channels
and defaults."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import data, style
from app.alerts_panel import alerts_settings
from db.vocabulary.cost import price_for
from db.vocabulary.settings_file import COST_KEYS, SettingsFileError, table_values, write_values
from db.vocabulary.your_cost import OwnPrice
from orchestrator.cost_text import own_price_text

style.apply()

st.title("Settings")


COST_LABELS = {"electricity_usd_per_kwh": "Tariff, USD per kWh", "pue": "PUE",
               "hardware_usd_per_gpu": "Hardware, USD per GPU", "hardware_life_years": "Its life, years",
               "busy_hours_per_year": "Busy hours a year"}


def your_cost() -> None:
    """The "Your cost" section: the ``[cost]`` keys of settings.toml, and what they make of a GPU-hour."""
    st.subheader("Your cost")
    machine = data.inventory()
    st.caption("What a run costs you: its measured energy x your electricity tariff x PUE, plus its device-hours "
               "x your hardware's price over its life's busy hours. Shown beside the cloud reference (the price "
               "table below), never added to it; every run, past ones too, is priced with today's values. PUE is "
               "1.0 unless you set it (the devices' energy alone, no cooling or power supplies)."
               + ("" if machine.kind == "gpu" else f" This machine has no GPU: the hardware price is the whole "
                  f"machine's, shared by its {machine.slots} slots."))
    home = data.settings().home
    try:
        values = table_values(home, "cost")
    except SettingsFileError as exc:
        st.error(style.plain(f"{exc}. Saving here writes every key anew."))
        values = {k.name: k.default for k in COST_KEYS}
    with st.form("your_cost", border=False):
        # Energy on one row, hardware on the next: three to a row keep the labels whole at 800 px.
        columns = [*st.columns(3)[:2], *st.columns(3)]
        entered = {key.name: column.number_input(
            COST_LABELS[key.name], value=values[key.name], min_value=key.minimum, max_value=key.maximum, step=None,
            format="%g", help=f"`cost.{key.name}`: {key.doc}", key=f"cost_{key.name}")
            for key, column in zip(COST_KEYS, columns, strict=True)}
        saved = st.form_submit_button("Save your cost", icon=":material/save:",
                                      disabled=data.read_only_reason() is not None, help=data.read_only_reason())
    if saved:
        try:
            write_values(home, {("cost", name): value for name, value in entered.items()})
        except SettingsFileError as exc:
            st.error(style.plain(str(exc)))
        else:
            st.cache_data.clear()  # the runs' summaries carry your cost
            values = dict(entered)  # as written (a misspelt key of the file is gone with it)
            st.success("Saved. Every run's cost of yours uses these values.")
    price = OwnPrice.from_values(values)
    st.info(style.plain(own_price_text(price)), icon=":material/calculate:")


your_cost()
st.subheader("Cloud reference prices (USD per hour)")
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
