"""The page bench/streamlit_floor.py serves: a title and one line chart of 8 ranks x 1,000 points.

``?chart=0`` draws the title alone (the floor of a page without a chart); ``?chart=click`` draws
the title and a "Draw" button, and the chart once it is pressed (the floor of a page's first chart
drawn after a click, as a run opened from the Runs page is).
"""

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

RANKS, POINTS = 8, 1000

st.title("floor")
mode = st.query_params.get("chart", "1")
if mode == "1" or (mode == "click" and st.button("Draw")):
    steps = np.arange(POINTS) * 10
    frame = pd.DataFrame({
        "step": np.tile(steps, RANKS),
        "rank": np.repeat([str(r) for r in range(RANKS)], POINTS),
        "loss": np.concatenate([2.5 * np.exp(-steps / 3000) + 0.01 * r + 0.05 * np.sin(steps / 97 + r)
                                for r in range(RANKS)]),
    })
    chart = alt.Chart(frame).mark_line().encode(x="step:Q", y="loss:Q", color="rank:N")
    st.altair_chart(chart, width="stretch")
