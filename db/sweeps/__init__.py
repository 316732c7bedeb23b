"""Sweeps in the database: the sweep state machine (``states``), what a person or a sweep asks of
a sweep and of its trials (``requests``), and the reads the UI and the CLI show (``queries``:
plain data). The tables are in db/models.py beside every other; what a sweep decides is
orchestrator/sweeps/."""
