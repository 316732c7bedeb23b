"""The Streamlit dashboard. Start it with ``runyard ui`` (or ``runyard up``)."""
