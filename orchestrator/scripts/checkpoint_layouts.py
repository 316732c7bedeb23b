"""What a framework writes last into a checkpoint folder: the file without which the folder is not
complete, however still it has been between two looks.

A folder the checkpoint glob matches is one checkpoint (orchestrator/scripts/checkpoint_finder.py).
While its framework writes it, it may hold all its weights and stop changing for seconds (the
optimizer's state being gathered, another rank's turn): two looks half a second apart called the
real Hugging Face Trainer's ``checkpoint-50/`` complete at 15 KB, 0.5 MB a second later. So a
folder laid out like a framework's checkpoint counts only once the file that framework writes last
is there:

- the Hugging Face ``Trainer``'s ``checkpoint-<n>/`` (told by ``training_args.bin``, or by that
  name with the Trainer's weights, optimizer, scheduler or RNG files): ``trainer_state.json``;
- PyTorch Distributed Checkpoint's folder (torchtitan, ``dcp.save``/``async_save``; told by its
  ``*.distcp`` files): ``.metadata``;
- ``accelerate``'s ``save_state`` (told by ``random_states_<r>.pkl``, ``optimizer.bin``,
  ``scheduler.bin`` or ``custom_checkpoint_<i>.pkl``): rank 0's ``random_states_0.pkl``, then
  the settle time.

``accelerate`` has no single last file: rank 0 writes the weights, optimizer, scheduler and
sampler states, then its ``random_states_0.pkl``; every other rank writes its own
``random_states_<rank>.pkl`` and rank 0 the registered objects' ``custom_checkpoint_<i>.pkl``
after that, with no barrier. Its folder needs ``random_states_0.pkl`` *and* the settle time.

A folder of no known layout has no marker, and counts once it has not changed for the settle time
(:data:`orchestrator.scripts.checkpoint_finder.SETTLE_S`); a single file is complete by its own
format where it has one (a ``torch.save`` zip archive: its end record, checked by
orchestrator/scripts/checkpoint_custody.py), else by the same settle time.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

HF_STATE = "trainer_state.json"
DCP_METADATA = ".metadata"
ACCELERATE_RNG = "random_states_0.pkl"

_HF_NAME = re.compile(r"checkpoint-\d+")
# The Trainer's own files in a checkpoint folder (transformers' WEIGHTS_NAME, SAFE_WEIGHTS_NAME and
# their shards and index, the adapters', OPTIMIZER_NAME, SCHEDULER_NAME, the RNG states).
_HF_FILE = re.compile(r"(model.*\.safetensors|pytorch_model.*\.bin|adapter_model.*|optimizer\.pt|scheduler\.pt"
                      r"|rng_state(_\d+)?\.pth|training_args\.bin)(\.index\.json)?")
_ACCELERATE_FILE = re.compile(r"random_states_\d+\.pkl|optimizer(_\d+)?\.bin|scheduler(_\d+)?\.bin"
                              r"|custom_checkpoint_\d+\.pkl")


@dataclass(frozen=True)
class Layout:
    """A framework's checkpoint folder.

    Attributes:
        framework: Its name, as a person reads it.
        marker: The file it writes last, relative to the folder.
        settle: Whether the settle time applies as well: files of other ranks may follow the
            marker (``accelerate``).
    """

    framework: str
    marker: str
    settle: bool = False

    def missing(self) -> str:
        """Why a folder of this layout without its marker is not complete, in words."""
        return f"no {self.marker}, which {self.framework} writes last: its save did not finish"


HF_TRAINER = Layout("the Hugging Face Trainer", HF_STATE)
DCP = Layout("PyTorch Distributed Checkpoint", DCP_METADATA)
ACCELERATE = Layout("accelerate's save_state", ACCELERATE_RNG, settle=True)


def layout_of(name: str, files: Collection[str]) -> Layout | None:
    """The framework whose checkpoint folder ``name`` holding ``files`` looks like, or None.

    Args:
        name: The folder's own name (``checkpoint-350``).
        files: Its files, relative to it (``model.safetensors``, ``sub/optimizer.pt``).
    """
    top = {f for f in files if "/" not in f}
    if any(f.endswith(".distcp") for f in files):
        return DCP
    if "training_args.bin" in top or HF_STATE in top or (
            _HF_NAME.fullmatch(name) and any(_HF_FILE.fullmatch(f) for f in top)):
        return HF_TRAINER
    if any(_ACCELERATE_FILE.fullmatch(f) for f in top):
        return ACCELERATE
    return None


def incomplete(name: str, files: Collection[str]) -> str | None:
    """Why the checkpoint folder ``name`` holding ``files`` is not complete yet (its framework's
    last file is missing), or None: complete, or no marker is known for it."""
    layout = layout_of(name, files)
    if layout is None or layout.marker in files:
        return None
    return layout.missing()
