"""The pages' panels that Streamlit draws around the chart builders of app/charts/: the Run page's
metric panels (issue 56 item 7: the Metrics section's charts grouped by prefix into sections, a
chart opened full width, the Overview's pinned curves, each person's layout kept across browser
sessions; app/views/run.py calls them inside its live fragment) and the parallel coordinates'
component that the sweep page and the Runs page share (``coordinates.py``)."""
