"""The Run page's metric panels (issue 56 item 7): the Metrics section's charts grouped by prefix
into sections, a chart opened full width, the Overview's pinned curves, and each person's layout
kept across browser sessions. The page (app/views/run.py) calls them inside its live fragment."""
