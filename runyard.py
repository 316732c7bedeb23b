"""runyard's SDK for your own training script, under a name that cannot clash::

    import runyard

    run = runyard.init()          # after init_process_group; a trainer.sdk.Run

The SDK lives in runyard's ``trainer`` package (trainer/sdk.py) and uses its ``db`` package, and
``import trainer`` keeps working for existing scripts. But ``trainer`` and ``db`` are common
names: a script may keep its own ``trainer.py`` (minGPT does) or ``db.py`` beside it, and with the
script's folder first on ``sys.path`` those files win the names. This module therefore loads
runyard's packages by their location (the folders beside this file), never through a search on
``sys.path``, imports every module the SDK will ever need while they hold the names, and then
gives the names back to whoever held them before: the script's own files stay its own.

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

__all__ = ["Run", "init"]

_ROOT = os.path.dirname(os.path.realpath(__file__))
# runyard's packages that the SDK uses, loaded from the folders beside this file.
_PACKAGES = ("trainer", "db")
# Every runyard module the SDK imports, when it loads or later inside a function:
# tests/unit/test_runyard.py checks the list against the source. All load while runyard's
# packages hold their names, so none is looked up by name later, when a script's own file may.
_SDK_MODULES = (
    "db.engine", "db.file_versions", "db.metricstore", "db.metricstore.bulk", "db.metricstore.points",
    "db.metricstore.rollups", "db.metricstore.series", "db.metricstore.writes", "db.models", "db.requests", "db.states",
    "db.vocabulary.checks", "db.vocabulary.config", "db.vocabulary.config.alerts", "db.vocabulary.config.base",
    "db.vocabulary.config.checkpoint", "db.vocabulary.config.labels", "db.vocabulary.config.launch",
    "db.vocabulary.config.reading", "db.vocabulary.config.reference", "db.vocabulary.config.run",
    "db.vocabulary.config.supervision", "db.vocabulary.config.sweep", "db.vocabulary.config.train",
    "db.vocabulary.config.workload",
    "db.vocabulary.cost", "db.vocabulary.inventory", "db.vocabulary.layout", "db.vocabulary.settings",
    "trainer.checkpoint", "trainer.checkpoint.checkpointer", "trainer.checkpoint.history", "trainer.checkpoint.io",
    "trainer.checkpoint.loading", "trainer.checkpoint.manager", "trainer.checkpoint.retention",
    "trainer.checkpoint.sharded", "trainer.checkpoint.writing", "trainer.context", "trainer.faults", "trainer.process",
    "trainer.process.distributed", "trainer.process.lifecycle", "trainer.process.pdeathsig",
    "trainer.process.process_exit", "trainer.process.store_secret", "trainer.reporting.control",
    "trainer.reporting.health", "trainer.reporting.monitoring", "trainer.reporting.reporter", "trainer.rng",
    "trainer.sdk",
)
_lock = threading.Lock()


def _in_our_package(path: str | None, package: str) -> bool:
    if path is None:
        return False
    folder = os.path.join(_ROOT, package)
    return os.path.realpath(path).startswith(folder + os.sep)


def _is_ours(module: ModuleType | None, package: str) -> bool:
    """Whether ``module`` (``package`` or one of its submodules) is runyard's own."""
    return _in_our_package(getattr(module, "__file__", None), package)


def _load_package(package: str) -> None:
    """Put runyard's ``package``, loaded from its folder, in ``sys.modules`` under its name."""
    folder = os.path.join(_ROOT, package)
    spec = importlib.util.spec_from_file_location(package, os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[package] = module
    spec.loader.exec_module(module)


def _load_sdk() -> ModuleType:
    """runyard's ``trainer.sdk``, whatever the names ``trainer`` and ``db`` resolve to on ``sys.path``."""
    with _lock:
        sdk = sys.modules.get("trainer.sdk")
        if _is_ours(sdk, "trainer"):
            assert sdk is not None
            return sdk
        # Modules of another's under our packages' names (a user's trainer.py, db.py): set aside
        # while ours load, then given back. Ours stay in sys.modules as trainer.<name>, db.<name>.
        others = {name: module for name, module in sys.modules.items()
                  if name.split(".")[0] in _PACKAGES and not _is_ours(module, name.split(".")[0])}
        # A name free now stays ours where a search would find ours anyway; one ours already stays.
        keep = {p for p in _PACKAGES if _is_ours(sys.modules.get(p), p) or (
            p not in sys.modules and _in_our_package(getattr(importlib.util.find_spec(p), "origin", None), p))}
        for name in others:
            del sys.modules[name]
        try:
            for package in _PACKAGES:
                if not _is_ours(sys.modules.get(package), package):
                    _load_package(package)
            for name in _SDK_MODULES:
                importlib.import_module(name)
            return sys.modules["trainer.sdk"]
        finally:
            for package in _PACKAGES:
                if package not in keep:
                    sys.modules.pop(package, None)
            sys.modules.update(others)


def __getattr__(name: str) -> Any:
    if name in ("init", "Run"):
        return getattr(_load_sdk(), name)
    raise AttributeError(f"module 'runyard' has no attribute {name!r}")
