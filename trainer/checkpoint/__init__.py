"""Checkpoints: asynchronous, atomic, verified saves of the whole training state, and a run's
resume from them.

- ``manager``: :class:`CheckpointManager` saves, verifies, loads and deletes the checkpoints
  under one folder (a step counts only when its manifest matches); its writer thread's part of
  a save is in ``writing`` (the files, the manifest, the rename), verifying and loading in
  ``loading``.
- ``io``: the byte-level tools it uses for a whole state (staging snapshot, hashing writer,
  parameters digest).
- ``sharded``: a state that holds DTensors (FSDP2), saved by every rank through PyTorch Distributed
  Checkpoint and loaded on any number of ranks; the manager's manifest covers its files.
- ``retention``: which checkpoints to keep (:func:`select_kept`).
- ``history``: a managed run's checkpoint records in the database, with retention applied.
- ``checkpointer``: :class:`Checkpointer`, a run's checkpoints as the SDK's ``Run`` uses them:
  resume (RNG states, superseding a newer lineage), save when due, close.

This package imports torch: the scheduler and the UI never import it.
"""

from trainer.checkpoint.checkpointer import Checkpointer, Stateful, supersede_after
from trainer.checkpoint.history import CheckpointHistory, event
from trainer.checkpoint.io import CheckpointError, params_digest
from trainer.checkpoint.loading import FORMAT_VERSION
from trainer.checkpoint.manager import CheckpointManager
from trainer.checkpoint.retention import CheckpointInfo, select_kept
from trainer.checkpoint.writing import SaveResult

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointHistory",
    "CheckpointInfo",
    "CheckpointManager",
    "Checkpointer",
    "SaveResult",
    "Stateful",
    "event",
    "params_digest",
    "select_kept",
    "supersede_after",
]
