"""The parallel coordinates as the sweep page and the Runs page mount them: one registration of
the component (app/charts/parallel.py has its code and the data it draws), whichever page a
session opens first."""

from __future__ import annotations

import streamlit as st
from streamlit.components.v2.types import ComponentRenderer

from app.charts import parallel


@st.cache_resource
def parallel_component() -> ComponentRenderer:
    """The parallel coordinates' component, registered once per process (Streamlit registers it
    again on a new runtime by itself: AppTest makes one per test)."""
    return st.components.v2.component(parallel.NAME, html=parallel.HTML, css=parallel.CSS, js=parallel.js_code())
