"""The scheduler and everything that touches processes: launcher, supervision, resources, cost
and ETA, and the `runyard` CLI."""


class OrchestratorError(Exception):
    """Base exception of the orchestrator package."""
