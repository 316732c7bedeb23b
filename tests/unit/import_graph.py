"""The imports between runyard's modules, read from the source: every ``import`` and ``from ...
import``, at module level or inside a function, since a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.unit.paths import ROOT

# Lower layers first: a package may import only the packages after it.
LAYERS = ("app", "orchestrator", "trainer", "db")

# Files that are not runyard's modules: migration scripts run by Alembic, the wandb stand-in put on
# a script's PYTHONPATH.
SKIP_PARTS = {"migrations", "shims"}


def module_paths() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            if SKIP_PARTS & set(path.relative_to(ROOT).parts):
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def imports_in(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the runyard modules it imports (a name resolves to the longest known module)."""
    modules = module_paths()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for target in imports_in(path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            # A module's own package (its __init__) is not an arrow of the house.
            if target and target != name and not name.startswith(f"{target}."):
                graph[name].add(target)
    return graph
