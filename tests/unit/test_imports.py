"""The house's shape, checked: imports point one way (app -> orchestrator -> trainer -> db), and
inside a package from room to room (orchestrator: cli -> scheduler -> sweeps -> alerts -> its own
modules -> scripts -> executors; app: views -> panels -> its own modules -> charts -> server;
trainer: agent -> workloads -> checkpoint -> process -> reporting; db: workspace -> sweeps ->
energy -> metricstore -> vocabulary),
no module imports itself through others, and the processes that never train never load torch.

The arrows are read from the source (every ``import`` and ``from ... import``, at module level or
inside a function, since a lazy import is still a dependency), not from what one run happens to
load.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.unit.import_graph import LAYERS, import_graph, imports_in, module_paths
from tests.unit.paths import ROOT

# Each package's rooms (its subpackages), highest first: a room may import only the rooms after it.
# A package's own name is the modules directly in it. orchestrator's: "orchestrator" is submission,
# display text and the UI access files, which the CLI and the UI share; ``python -m orchestrator``
# (__main__) is the CLI's. app's: the pages (views) use the pages' parts, which draw with the chart
# builders (charts), and the server side (server) serves them without importing any (it loads
# app/main.py by its path).
ROOMS = {
    "app": (
        "app.views",
        "app.panels",
        "app",
        "app.charts",  # rewrite-imports: keep (the package, not the module of this name before)
        "app.server",  # rewrite-imports: keep (the package, not the module of this name before)
    ),
    "orchestrator": (
        "orchestrator.cli",  # rewrite-imports: keep (the packages, not the modules of these names before)
        "orchestrator.scheduler",  # rewrite-imports: keep
        "orchestrator.sweeps",
        "orchestrator.alerts",
        "orchestrator",
        "orchestrator.scripts",
        "orchestrator.executors",  # rewrite-imports: keep
    ),
    # trainer's own modules are no room: the entry point (__main__) sits above the workloads, and
    # the SDK, the contract and the fault hooks below them and beside the checkpoint manager.
    "trainer": ("trainer.agent", "trainer.workloads", "trainer.checkpoint", "trainer.process", "trainer.reporting"),
    # db's own modules are no room either: the models and the engine below everything, the read
    # queries above the metric store. A sweep's rows (sweeps) read the metric store's and the runs';
    # the energy tallies (energy) write with the metric store's upsert.
    "db": ("db.workspace", "db.sweeps", "db.energy", "db.metricstore", "db.vocabulary"),
}

ROOM_OF = {"orchestrator.__main__": "orchestrator.cli"}  # rewrite-imports: keep


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def _room(module: str) -> int | None:
    """The index of ``module``'s room among its package's ROOMS; None where no room holds it."""
    rooms = ROOMS.get(module.split(".")[0], ())
    if module in ROOM_OF:
        return rooms.index(ROOM_OF[module])
    # The longest room that holds the module: orchestrator.scripts.log_lines is in scripts, not in
    # the room of orchestrator's own modules.
    holding = [room for room in rooms if module == room or module.startswith(f"{room}.")]
    return rooms.index(max(holding, key=len)) if holding else None


def test_imports_point_down_the_layers() -> None:
    upward = sorted(f"{src} -> {dst}" for src, dsts in import_graph().items() for dst in dsts
                    if _layer(dst) < _layer(src))
    assert not upward, "imports must point app -> orchestrator -> trainer -> db:\n" + "\n".join(upward)


def _upward(src: str, dst: str) -> bool:
    """Whether ``src -> dst`` goes up the rooms of their package."""
    if src.split(".")[0] != dst.split(".")[0]:
        return False
    src_room, dst_room = _room(src), _room(dst)
    return src_room is not None and dst_room is not None and dst_room < src_room


def test_inside_a_package_imports_point_down_the_rooms() -> None:
    # The loop decides, an executor does: executors know nothing of scripts or of the scheduler;
    # plain-script support knows nothing of the scheduler; nothing below the CLI imports it. The
    # UI's server knows nothing of the pages; the vocabulary nothing of db's SQL modules.
    upward = sorted(f"{src} -> {dst}" for src, dsts in import_graph().items() for dst in dsts if _upward(src, dst))
    order = "; ".join(" -> ".join(rooms) for rooms in ROOMS.values())
    assert not upward, f"imports must point {order}:\n" + "\n".join(upward)


def test_every_subpackage_is_a_room() -> None:
    # A new subpackage must take its place in ROOMS (and in docs/DESIGN.md's table of folders).
    modules = module_paths()
    for package, rooms in ROOMS.items():
        subpackages = {".".join(m.split(".")[:2]) for m in modules if m.count(".") >= 2 and m.startswith(f"{package}.")}
        assert subpackages <= set(rooms), f"{package} packages not in ROOMS: {sorted(subpackages - set(rooms))}"
        held = {rooms[i] for m in modules if m.split(".")[0] == package and (i := _room(m)) is not None}
        assert held == set(rooms), f"rooms of {package} that hold no module: {sorted(set(rooms) - held)}"


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(module_paths()):
        if module not in index:
            visit(module)
    assert not circles, f"import circles: {circles}"


def test_the_graph_sees_real_arrows() -> None:
    # The checks above would pass on an empty graph: make sure they look at the real one.
    graph = import_graph()
    assert "db.models" in graph["orchestrator.scheduler.loop"]
    assert "orchestrator.executors.launcher" in graph["orchestrator.scheduler.loop"]
    assert "orchestrator.scripts.attempt_watch" in graph["orchestrator.scheduler.loop"]
    assert "orchestrator.executors.processes" in graph["orchestrator.scripts.attempt_watch"]
    assert "app.server.access" in graph["app.server.gate"]
    assert "db.vocabulary.layout" in graph["trainer.checkpoint.manager"]


def test_docs_design_names_every_trainer_module_the_orchestrator_and_the_ui_import() -> None:
    """docs/DESIGN.md lists what of trainer/ the processes that never train import (torch-free
    modules only); the list is read from the imports, so a new one cannot go unsaid."""
    packages = {name for name, path in module_paths().items() if path.name == "__init__.py"}  # `from pkg import mod`
    imported = sorted({dst for src, dsts in import_graph().items() if src.split(".")[0] in ("orchestrator", "app")
                       for dst in dsts if dst.split(".")[0] == "trainer" and dst not in packages})
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    match = re.search(r"^What `orchestrator/` and `app/` import of `trainer/`[\s\S]*?\n(?P<body>(?:- .*\n)+)",
                      design, re.MULTILINE)
    assert match is not None, "docs/DESIGN.md has no list of the trainer modules orchestrator and app import"
    listed = sorted(re.findall(r"^- `([\w.]+)`", match["body"], re.MULTILINE))
    assert listed == imported, f"docs/DESIGN.md lists {listed}; orchestrator and app import {imported}"


def test_the_scheduler_the_ui_and_the_cli_never_load_torch() -> None:
    # torch costs the scheduler ~1.7 s and ~230 MiB; only the ranks need it.
    code = ("import sys, orchestrator.scheduler.loop, orchestrator.cli.group, app.data, app.server.gate,"
            " app.server.asgi;"
            "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'));"
            "print(loaded[:5]); sys.exit(1 if loaded else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"torch was imported: {result.stdout} {result.stderr[-2000:]}"


def test_a_rank_loads_no_sqlalchemy_before_it_writes() -> None:
    # Only rank 0 writes, from its writer thread; SQLAlchemy and the models cost every rank
    # ~0.5 s of start-up on the critical path otherwise (issue 32). What `python -m trainer` and
    # the SDK import, and the built-in workloads.
    code = ("import sys, trainer.__main__, trainer.sdk, trainer.workloads.mlp_digits, trainer.workloads.gpt_char;"
            "loaded = sorted(m for m in sys.modules if m.startswith(('sqlalchemy', 'db.models', 'db.engine')));"
            "print(loaded[:5]); sys.exit(1 if loaded else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"SQLAlchemy was imported: {result.stdout} {result.stderr[-2000:]}"


def test_the_vocabulary_imports_no_sql() -> None:
    # db/vocabulary/ is what every process shares without a database (issue 27, item 3): the
    # config model, layout, causes, cost, settings. An import of SQLAlchemy or of db/'s SQL modules
    # there, at module level or lazily, would put the database under every importer again.
    sql_modules = {m for m in module_paths() if m.startswith("db.") and not m.startswith("db.vocabulary")} - {"db"}
    found = []
    for name, path in module_paths().items():
        if name.startswith("db.vocabulary"):
            bad = sorted(t for t in imports_in(path) if t.split(".")[0] == "sqlalchemy" or t in sql_modules)
            found += [f"{name} imports {t}" for t in bad]
    assert not found, "\n".join(found)
