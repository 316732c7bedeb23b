"""The page bench/streamlit_floor.py serves: a title and one line chart of 8 ranks x 1,000 points.

``?chart=0`` draws the title alone (the floor of a page without a chart).
"""

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

RANKS, POINTS = 8, 1000

st.title("floor")
if st.query_params.get("chart", "1") != "0":
    steps = np.arange(POINTS) * 10
    frame = pd.DataFrame({
        "step": np.tile(steps, RANKS),
        "rank": np.repeat([str(r) for r in range(RANKS)], POINTS),
        "loss": np.concatenate([2.5 * np.exp(-steps / 3000) + 0.01 * r + 0.05 * np.sin(steps / 97 + r)
                                for r in range(RANKS)]),
    })
    chart = alt.Chart(frame).mark_line().encode(x="step:Q", y="loss:Q", color="rank:N")
    st.altair_chart(chart, width="stretch")
