"""The database: models, engine set-up, the run state machine, and the queries and requests
that the UI and the CLI use. It is the single source of truth of runyard."""


class DatabaseError(Exception):
    """Base exception of the db package."""
