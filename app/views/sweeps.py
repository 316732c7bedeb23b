"""Sweeps: every sweep with its state, best value, trials by state, budget spent and left, and when
it ends, live; the link in the first column opens the sweep's page (``sweep?id=N``).

The list is db/sweeps/queries.py's ``sweep_list`` (app/sweep_data.py caches it for two seconds).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import style, sweep_data
from app.style import SWEEP_BADGE, status_css

style.apply()

COLUMNS = ["sweep", "name", "state", "best", "trials", "by state", "spent", "left", "ends", "id"]


def sweeps_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame({
        "sweep": [f"sweep?id={r['id']}" for r in rows],
        "id": [r["id"] for r in rows],
        "name": [r["name"] for r in rows],
        "state": [r["status"] for r in rows],
        "best": [sweep_data.value_text(r["best"]["value"] if r["best"] else None) for r in rows],
        "trials": [f"{r['trial_count']} / {r['max_trials']}" for r in rows],
        "by state": [sweep_data.by_state_text(r["by_status"]) for r in rows],
        "spent": [sweep_data.spent_text(r) for r in rows],
        "left": [sweep_data.left_text(r) for r in rows],
        "ends": [sweep_data.eta_words(r) for r in rows],
    }, columns=COLUMNS)


def empty_state() -> None:
    st.info("No sweeps yet. A sweep tries settings of a run config, each trial a run, and stops the ones that "
            "fall behind early. Start one with `runyard sweep start examples/sweep.toml` (`runyard sweep preview "
            "FILE` first says what it will train and cost), or on the **New sweep** page; docs/SWEEPS.md says how "
            "to write one.")
    st.page_link("views/new_sweep.py", label="New sweep", icon=":material/add_chart:")


@st.fragment(run_every=3)
def sweeps_table() -> None:
    rows = sweep_data.sweeps()
    if not rows:
        empty_state()
        return
    frame = sweeps_frame(rows)
    st.dataframe(
        frame.style.map(status_css, subset=["state"], badges=SWEEP_BADGE),
        hide_index=True,
        column_order=[c for c in COLUMNS if c != "id"],
        column_config={
            "sweep": st.column_config.LinkColumn("sweep", display_text=r"sweep\?id=(\d+)", help="Open the sweep"),
            "best": st.column_config.TextColumn(
                "best", help="The best trial's value of the sweep's metric: the deepest trained, then the best there"),
            "trials": st.column_config.TextColumn("trials", help="Trials made / max_trials"),
            "spent": st.column_config.TextColumn("spent", help="Device-hours of every trial's attempts · their "
                                                               "cost · wall time since the sweep started"),
            "left": st.column_config.TextColumn("left", help="What the budget ([sweep.budget]) has left"),
            "ends": st.column_config.TextColumn("ends", help="A rough ETA: the trials left at the mean time of "
                                                             "those that ended, max_concurrent at a time"),
        },
        key="sweeps_table",
    )
    st.caption(f"{len(rows)} sweep(s), newest first. The link in the *sweep* column opens its page.")


st.title("Sweeps")
sweeps_table()
