"""The charts the pages draw, built from plain rows and returning Altair charts: a metric's chart
(``metric.py``, whose layers ``layers.py`` decides, one rule a layer) and the Compare page's
shapes (``compare.py``), and the Runs list grid's cells and column widths (``runs_grid.py``, no
Altair: the Runs page loads none). Nothing here calls Streamlit or reads the database."""
