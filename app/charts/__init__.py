"""The charts the pages draw, built from plain rows and returning Altair charts: a metric's chart
(``metric.py``, whose layers ``layers.py`` decides, one rule a layer) and the Compare page's
shapes (``compare.py``). Nothing here calls Streamlit or reads the database."""
