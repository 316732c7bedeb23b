"""The SQL-free vocabulary every process shares: the run config model, the on-disk layout, causes,
cost and ETA arithmetic, the machine inventory, the metric registry, the settings. Nothing here
imports SQLAlchemy; the UI, CLI, scheduler and ranks all import it."""
