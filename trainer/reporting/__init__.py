"""What the ranks report while they train, without blocking on the database.

- ``control``: runyard's own collective, one small exchange per step: the stop and save flags
  every rank agrees on, and at log steps every rank's metrics for rank 0;
- ``monitoring``: :class:`~trainer.reporting.monitoring.Monitor`, through which a training loop
  reports: per-rank metrics, memory and the health checks' measurements, in that collective;
- ``health``: the straggler and desync checks, measured on every rank and decided on rank 0;
- ``reporter``: rank 0's background writer, which batches the rows into the database.
"""
