"""runyard's SDK for your own training script, under a name that cannot clash::

    import runyard

    run = runyard.init()          # after init_process_group; a trainer.sdk.Run

The SDK lives in runyard's ``trainer`` package (trainer/sdk.py), and ``import trainer`` keeps
working for existing scripts. But ``trainer`` is a common name: a script may keep its own
``trainer.py`` beside it (minGPT does), and with the script's folder first on ``sys.path`` that
file wins the name. This module therefore reaches runyard's ``trainer`` package by its location
(the folder beside this file), never through the name's search on ``sys.path``, and leaves the
name ``trainer`` to whoever held it before.

Importing this module is cheap and does not import torch: the SDK is loaded on first use of
``init`` or ``Run``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and editors; at run time, __getattr__ below
    from trainer.sdk import Run, init

__all__ = ["init", "Run"]

# runyard's own trainer package: the folder beside this file (a checkout or site-packages).
_TRAINER_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "trainer")
_lock = threading.Lock()


def _in_our_package(path: str | None) -> bool:
    return path is not None and os.path.dirname(os.path.realpath(path)) == _TRAINER_DIR


def _is_ours(module: ModuleType | None) -> bool:
    """Whether ``module`` (``trainer`` or one of its submodules) is runyard's own."""
    return _in_our_package(getattr(module, "__file__", None))


def _is_ours_spec(spec: importlib.machinery.ModuleSpec | None) -> bool:
    return spec is not None and _in_our_package(spec.origin)


def _load_sdk() -> ModuleType:
    """runyard's ``trainer.sdk``, whatever the name ``trainer`` resolves to on ``sys.path``."""
    with _lock:
        sdk = sys.modules.get("trainer.sdk")
        if _is_ours(sdk):
            assert sdk is not None
            return sdk
        current = sys.modules.get("trainer")
        if _is_ours(current):
            return importlib.import_module("trainer.sdk")
        # The name is free or held by another module (a user's trainer.py): put runyard's
        # package under it, loaded from its own folder, while the SDK and the modules it
        # imports load; then give the name back. The SDK's modules keep their references to
        # each other, and stay in sys.modules as trainer.<name>.
        others = {name: module for name, module in sys.modules.items()
                  if (name == "trainer" or name.startswith("trainer.")) and not _is_ours(module)}
        # With the name free, ours keeps it when a search would find ours anyway.
        keep = current is None and _is_ours_spec(importlib.util.find_spec("trainer"))
        for name in others:
            del sys.modules[name]
        try:
            spec = importlib.util.spec_from_file_location(
                "trainer", os.path.join(_TRAINER_DIR, "__init__.py"),
                submodule_search_locations=[_TRAINER_DIR])
            assert spec is not None and spec.loader is not None
            package = importlib.util.module_from_spec(spec)
            sys.modules["trainer"] = package
            spec.loader.exec_module(package)
            return importlib.import_module("trainer.sdk")
        finally:
            if not keep:
                sys.modules.pop("trainer", None)
            sys.modules.update(others)


def __getattr__(name: str) -> Any:
    if name in ("init", "Run"):
        return getattr(_load_sdk(), name)
    raise AttributeError(f"module 'runyard' has no attribute {name!r}")
