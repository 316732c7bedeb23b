"""The step a script's own checkpoint holds, read from the checkpoint where its framework records
it, so that "steps lost" and a resume's step are the checkpoint's, not the last step runyard read.

In this order (the first that answers wins):

1. Hugging Face ``Trainer``: ``trainer_state.json``'s ``global_step``, in the checkpoint folder
   (``hf_out/checkpoint-350/``) or beside a file inside it.
2. A ``torch.save`` zip archive (Lightning's ``.ckpt``, nanoGPT's ``ckpt.pt``, a plain
   ``{"step": ...}`` dict): a top-level key of the pickled dict, ``global_step`` (Lightning),
   ``iter_num`` (nanoGPT), ``step``, ``iteration``, or the one the config names. The pickle is
   read by :class:`_InertUnpickler`, which never imports a module nor calls anything the pickle
   names: every class and function it names becomes an inert placeholder, and tensors' storages
   are not read at all. So a Lightning checkpoint (whose objects ``torch.load(weights_only=True)``
   may refuse) is read safely, without torch or Lightning installed (the scheduler loads neither).
3. A number in the name: ``step=300`` / ``step_300`` / ``step300``, ``checkpoint-350``,
   ``ckpt_000350.pt``, ``iter_1500``, ``global_step400`` (the file's name, then its folder's).
   A bare number elsewhere (``model_v2.pt``, ``epoch=3``) is not a step, nor is the number of
   ``accelerate``'s automatic names (``checkpoints/checkpoint_<i>``, ``ProjectConfiguration(
   automatic_checkpoint_naming=True)``): ``i`` counts its saves, not steps (read as a step, a run
   that saved 3 times by step 67 was said to have lost 58 steps where about 9 were lost, and
   its progress fell back to step 1).

None of them: the caller falls back on the last step the attempt had reported when the file was
written (orchestrator/scripts/checkpoint_custody.py).
"""

from __future__ import annotations

import io
import json
import pickle
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HF_STATE = "trainer_state.json"
STEP_KEYS = ("global_step", "iter_num", "step", "iteration")
# data.pkl of a checkpoint is small (the tensors' bytes are separate records); a bigger one is not read.
MAX_PICKLE_BYTES = 64 << 20
MAX_JSON_BYTES = 16 << 20
# accelerate's automatic checkpoint naming: checkpoint_<i>, i the number of saves before it.
_SAVE_COUNTER = re.compile(r"checkpoint_\d+")
_NAME_STEP = re.compile(
    r"(?:^|[^a-z])(?:global_step|step|steps|iter|iters|iteration|checkpoint|ckpt)[=_-]?(\d+)(?!\d)", re.IGNORECASE)


class _StateDict(dict[Any, Any]):
    """A pickled ``OrderedDict`` as a plain dict. A module's ``state_dict()`` carries its
    ``_metadata`` as instance state, which pickle sets after the items (BUILD); a plain dict has
    no ``__dict__`` for it, so the whole read failed on every ``torch.save({"model":
    model.state_dict(), ...})``: nanoGPT's and the DDP tutorial's checkpoints among them."""

    def __setstate__(self, state: object) -> None:
        pass


_SAFE = {("collections", "OrderedDict"): _StateDict, ("builtins", "set"): set, ("builtins", "frozenset"): frozenset}


def step_in_checkpoint(path: str | Path, keys: Sequence[str] = ()) -> int | None:
    """The step the checkpoint at ``path`` (a file or a folder) holds, or None when it says none.

    Args:
        path: The checkpoint: a file, or a folder the checkpoint glob matched.
        keys: Top-level keys of a ``torch.save`` dict to try before :data:`STEP_KEYS`.
    """
    path = Path(path)
    for found in (_hf_step(path), _pickled_step(path, keys), name_step(path)):
        if found is not None:
            return found
    return None


def name_step(path: str | Path) -> int | None:
    """The step a checkpoint's name gives (its own name, then its folder's), or None."""
    path = Path(path)
    for name in (path.name, path.parent.name):
        if _SAVE_COUNTER.fullmatch(name):
            return None  # a count of saves, not a step: the caller falls back on the reported step
        matches = _NAME_STEP.findall(name)
        if matches:
            return int(matches[-1])
    return None


def _hf_step(path: Path) -> int | None:
    for folder in ((path,) if path.is_dir() else (path.parent,)):
        state = folder / HF_STATE
        try:
            if not state.is_file() or state.stat().st_size > MAX_JSON_BYTES:
                continue
            step = json.loads(state.read_text()).get("global_step")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
    return None


def _pickled_step(path: Path, keys: Sequence[str]) -> int | None:
    if not path.is_file():
        return None
    top = read_pickled_dict(path)
    if top is None:
        return None
    for key in (*keys, *STEP_KEYS):
        value = top.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def read_pickled_dict(path: str | Path) -> dict[str, Any] | None:
    """The top-level dict of a ``torch.save`` zip archive, rebuilt inertly (:class:`_InertUnpickler`),
    or None: not a zip archive, no ``data.pkl``, too big, not a dict, or not readable."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            if not names:
                return None
            info = archive.getinfo(min(names, key=len))
            if info.file_size > MAX_PICKLE_BYTES:
                return None
            data = archive.read(info)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return None
    try:
        top = _InertUnpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - any malformed pickle: the checkpoint says no step
        return None
    return top if isinstance(top, dict) else None


class _Inert(dict[Any, Any]):
    """What every class or function a pickle names becomes: it takes any arguments, items, list
    items and state, and does nothing with them (a dict, so a pickled dict subclass still reads)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__()
        self.args = args

    def __call__(self, *args: object, **kwargs: object) -> _Inert:  # what getattr(placeholder, name) gave
        return _Inert(*args)

    def __setstate__(self, state: object) -> None:
        self.state = state

    def append(self, item: object) -> None:
        pass

    def extend(self, items: object) -> None:
        pass


class _InertUnpickler(pickle.Unpickler):
    """An unpickler that imports nothing and calls nothing the pickle names: a global is an
    :class:`_Inert` placeholder (only ``OrderedDict`` and sets are rebuilt as plain containers),
    and a persistent id (a tensor's storage in ``torch.save``'s format) is None, never read."""

    def find_class(self, module: str, name: str) -> Any:
        return _SAFE.get((module, name), _Inert)

    def persistent_load(self, pid: object) -> Any:
        return None
