"""Rooms stay small and named: no package folder holds more than LIMIT modules directly unless
docs/DESIGN.md gives the reason and a ceiling ("Folders past the limit"), no module passes
LINE_LIMIT lines unless DESIGN.md gives the reason and a ceiling ("Modules past the limit"), and
DESIGN.md's table of folders names every package folder there is.

The unit tests are held to the same rule in their own rooms (docs/DEVELOPMENT.md, "Test folders
past the limit" and "Test modules past the limit"), and live beside what they test: a test module
of tests/unit/<package path>/ is named after a module of <package path>/ (test_retry.py, or
test_retry_<concern>.py for one of several), and tests/unit itself holds only the house's checks
(HOUSE_TESTS) and runyard.py's test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
DEVELOPMENT = ROOT / "docs" / "DEVELOPMENT.md"
PACKAGES = ("app", "orchestrator", "trainer", "db")
UNIT = "tests/unit"
# tests/unit's own test modules: the house's shape (imports, rooms) and the test helpers' own tests
# (tests/durations.py, tests/databases.py, tests/slurm_cluster.py's fixture).
HOUSE_TESTS = frozenset({"test_imports.py", "test_rooms.py", "test_durations.py", "test_databases.py",
                         "test_slurm_fixture.py"})
LIMIT = 15
LINE_LIMIT = 400
# Not rooms of runyard's code: Alembic's migration scripts, the wandb stand-in put on a script's path.
SKIP_PARTS = {"migrations", "shims", "__pycache__"}
# "- `db/` (23 modules): the reason ..." in the section "Folders past the limit".
_EXEMPTION = re.compile(r"^- `(?P<folder>[\w/]+)/` \((?P<ceiling>\d+) modules\): (?P<reason>\S.*)$")
# "- `db/models.py` (424 lines): the reason ..." in the section "Modules past the limit".
_LONG_MODULE = re.compile(r"^- `(?P<module>[\w/]+\.py)` \((?P<ceiling>\d+) lines\): (?P<reason>\S.*)$")


def module_counts(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, int]:
    """Package folder (relative, no trailing slash) -> its modules directly in it, not ``__init__.py``."""
    counts = {}
    for package in packages:
        for folder in [root / package, *sorted(p for p in (root / package).rglob("*") if p.is_dir())]:
            relative = folder.relative_to(root)
            if SKIP_PARTS & set(relative.parts) or not (folder / "__init__.py").exists():
                continue
            counts[relative.as_posix()] = sum(1 for f in folder.glob("*.py") if f.name != "__init__.py")
    return counts


def line_counts(root: Path, packages: tuple[str, ...] = PACKAGES, extra: tuple[str, ...] = ("runyard.py",)
                ) -> dict[str, int]:
    """Module (relative path) -> its lines, for every module of the packages and runyard.py;
    Alembic's migration scripts are not runyard's modules."""
    paths = [*(root / name for name in extra),
             *(p for package in packages for p in sorted((root / package).rglob("*.py")))]
    return {p.relative_to(root).as_posix(): len(p.read_text().splitlines()) for p in paths
            if p.exists() and not {"migrations", "__pycache__"} & set(p.relative_to(root).parts)}


def _listed(design: str, section: str, bullet: re.Pattern[str], name: str) -> dict[str, int]:
    """Name -> the ceiling docs/DESIGN.md gives it, with a reason, under the heading ``section``."""
    match = re.search(rf"^#+ {section}\n(?P<body>.*?)(?=^#|\Z)", design, re.MULTILINE | re.DOTALL)
    if match is None:
        return {}
    found = {}
    # A bullet's reason may go on over the following indented lines; the first line names it.
    for line in match["body"].splitlines():
        if (m := bullet.match(line)) and len(m["reason"].split()) >= 3:
            found[m[name]] = int(m["ceiling"])
    return found


def exemptions(design: str, section: str = "Folders past the limit") -> dict[str, int]:
    """Folder -> the ceiling docs/DESIGN.md gives it, with a reason, under "Folders past the limit"
    (or docs/DEVELOPMENT.md under ``section``)."""
    return _listed(design, section, _EXEMPTION, "folder")


def long_modules(design: str, section: str = "Modules past the limit") -> dict[str, int]:
    """Module -> the ceiling docs/DESIGN.md gives it, with a reason, under "Modules past the limit"
    (or docs/DEVELOPMENT.md under ``section``)."""
    return _listed(design, section, _LONG_MODULE, "module")


def _past(counts: dict[str, int], allowed: dict[str, int], limit: int, what: str, where: str) -> list[str]:
    """Each of ``counts`` past ``limit`` without a reason in ``where`` (a document's section), or past
    the ceiling its reason gives; ``what`` says what is counted ("modules", "lines")."""
    problems = []
    for name, count in sorted(counts.items()):
        ceiling = allowed.get(name, limit)
        if count > ceiling:
            why = (f"past its ceiling of {ceiling} in {where}" if name in allowed
                   else f"past {limit} with no reason in {where}")
            problems.append(f"{name} holds {count} {what}, {why}")
    return problems


def too_long(counts: dict[str, int], allowed: dict[str, int],
             where: str = 'docs/DESIGN.md ("Modules past the limit")') -> list[str]:
    """Each module past LINE_LIMIT without a reason, or past the ceiling its reason gives."""
    return _past(counts, allowed, LINE_LIMIT, "lines", where)


def crowded(counts: dict[str, int], allowed: dict[str, int],
            where: str = 'docs/DESIGN.md ("Folders past the limit")') -> list[str]:
    """Each folder past LIMIT without a reason, or past the ceiling its reason gives."""
    shown = {f"{folder}/": count for folder, count in counts.items()}
    return _past(shown, {f"{folder}/": ceiling for folder, ceiling in allowed.items()}, LIMIT, "modules", where)


def test_no_folder_grows_past_its_module_count() -> None:
    problems = crowded(module_counts(ROOT), exemptions(DESIGN.read_text()))
    assert not problems, "split the folder into rooms, or give the reason in docs/DESIGN.md:\n" + "\n".join(problems)


def test_every_exemption_is_still_needed() -> None:
    # A ceiling above what a folder holds, or for a folder that is gone, would let it grow unseen.
    counts = module_counts(ROOT)
    stale = {folder: ceiling for folder, ceiling in exemptions(DESIGN.read_text()).items()
             if counts.get(folder, 0) <= LIMIT or counts[folder] != ceiling}
    assert not stale, f"update docs/DESIGN.md's \"Folders past the limit\": ceilings {stale}, modules now {counts}"


def test_no_module_grows_past_its_line_count() -> None:
    problems = too_long(line_counts(ROOT), long_modules(DESIGN.read_text()))
    assert not problems, "split the module by concern, or give the reason in docs/DESIGN.md:\n" + "\n".join(problems)


def test_every_module_exemption_is_still_needed() -> None:
    # A ceiling above what a module holds, or for a module that is gone, would let it grow unseen.
    counts = line_counts(ROOT)
    stale = {module: (ceiling, counts.get(module)) for module, ceiling in long_modules(DESIGN.read_text()).items()
             if counts.get(module, 0) <= LINE_LIMIT or counts[module] != ceiling}
    assert not stale, f"update docs/DESIGN.md's \"Modules past the limit\" (ceiling, lines now): {stale}"


def test_the_table_of_folders_names_every_package_folder() -> None:
    design = DESIGN.read_text()
    missing = [folder for folder in module_counts(ROOT) if f"| `{folder}/` |" not in design]
    assert not missing, f"docs/DESIGN.md's table of folders does not say what lives in: {missing}"


# -- the unit tests' own rooms ---------------------------------------------------------------------

TEST_FOLDERS = "Test folders past the limit"
TEST_MODULES = "Test modules past the limit"


def unit_module_counts(root: Path) -> dict[str, int]:
    """tests/unit and each test folder under it -> the modules directly in it, helpers and tests alike."""
    return module_counts(root, (UNIT,))


def unit_line_counts(root: Path) -> dict[str, int]:
    """Each module of tests/unit (relative path) -> its lines."""
    return line_counts(root, (UNIT,), extra=())


def misplaced_tests(root: Path) -> list[str]:
    """Each test module of tests/unit not named after a module of the package folder its own folder
    mirrors (tests/unit/orchestrator/scheduler/test_retry.py tests orchestrator/scheduler/retry.py;
    the name may go on with a concern, test_retry_disk.py); tests/unit's top holds the house's
    checks and the tests of the checkout's top modules (runyard.py). A subpackage is a room with a
    test folder of its own; only outside the rooms (the wandb stand-in under shims/) may a test be
    named after a folder."""
    unit = root / UNIT
    problems = []
    for path in sorted(unit.rglob("test_*.py")):
        folder = path.parent.relative_to(unit)
        if folder == Path(".") and path.name in HOUSE_TESTS:
            continue
        mirrored = root / folder
        words = path.stem.removeprefix("test_").split("_")
        names = ["_".join(words[:n]) for n in range(len(words), 0, -1)]
        outside_rooms = bool(SKIP_PARTS & set(folder.parts))
        if not any((mirrored / f"{name}.py").is_file() or (outside_rooms and (mirrored / name).is_dir())
                   for name in names):
            problems.append(path.relative_to(root).as_posix())
    return problems


def test_no_test_folder_grows_past_its_module_count() -> None:
    where = f'docs/DEVELOPMENT.md ("{TEST_FOLDERS}")'
    problems = crowded(unit_module_counts(ROOT), exemptions(DEVELOPMENT.read_text(), TEST_FOLDERS), where)
    assert not problems, ("split the test folder as its package is split, or give the reason in docs/DEVELOPMENT.md:\n"
                          + "\n".join(problems))


def test_no_test_module_grows_past_its_line_count() -> None:
    where = f'docs/DEVELOPMENT.md ("{TEST_MODULES}")'
    problems = too_long(unit_line_counts(ROOT), long_modules(DEVELOPMENT.read_text(), TEST_MODULES), where)
    assert not problems, ("split the test module by the module or concern it tests, or give the reason in "
                          "docs/DEVELOPMENT.md:\n" + "\n".join(problems))


def test_every_test_exemption_is_still_needed() -> None:
    development = DEVELOPMENT.read_text()
    folders, modules = unit_module_counts(ROOT), unit_line_counts(ROOT)
    stale = {folder: (ceiling, folders.get(folder)) for folder, ceiling in exemptions(development, TEST_FOLDERS).items()
             if folders.get(folder, 0) <= LIMIT or folders[folder] != ceiling}
    stale |= {module: (ceiling, modules.get(module)) for module, ceiling in
              long_modules(development, TEST_MODULES).items()
              if modules.get(module, 0) <= LINE_LIMIT or modules[module] != ceiling}
    assert not stale, f"update docs/DEVELOPMENT.md's exemptions (ceiling, count now): {stale}"


def test_every_test_module_is_named_after_the_module_it_tests_in_its_packages_folder() -> None:
    misplaced = misplaced_tests(ROOT)
    assert not misplaced, (
        "name each test module after the module it tests, in the folder of tests/unit that mirrors its package "
        "(tests/unit/orchestrator/scheduler/test_retry.py tests orchestrator/scheduler/retry.py), or add a check of "
        "the house to HOUSE_TESTS:\n" + "\n".join(misplaced))


@pytest.mark.parametrize(("test", "misplaced"), [
    ("tests/unit/orchestrator/scheduler/test_retry.py", False),
    ("tests/unit/orchestrator/scheduler/test_retry_disk.py", False),  # the module, then a concern
    ("tests/unit/test_runyard.py", False),  # the checkout's top module
    ("tests/unit/test_rooms.py", False),  # a house check
    ("tests/unit/orchestrator/scripts/shims/test_wandb.py", False),  # a folder outside the rooms
    ("tests/unit/test_scheduler.py", True),  # flat: a room's test belongs in its folder
    ("tests/unit/test_retry.py", True),
    ("tests/unit/orchestrator/test_scheduler_tick.py", True),  # a subpackage has a test folder of its own
    ("tests/unit/orchestrator/scheduler/test_custody.py", True),  # no module of that name
])
def test_a_test_module_not_beside_its_module_is_caught(tmp_path: Path, test: str, misplaced: bool) -> None:
    for module in ("runyard.py", "orchestrator/scheduler/retry.py", "orchestrator/scripts/shims/wandb/__init__.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    (tmp_path / test).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / test).write_text("")
    assert misplaced_tests(tmp_path) == ([test] if misplaced else [])


def test_the_test_folders_are_counted_as_the_packages_are(tmp_path: Path) -> None:
    _package(tmp_path, "tests/unit/app/views", LIMIT + 1)
    for package in ("tests/unit", "tests/unit/app"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "tests" / "unit" / "apptest.py").write_text("x = 1\n" * (LINE_LIMIT + 1))
    _package(tmp_path, "tests/unit/orchestrator/scripts/shims", 1)  # outside the rooms: never counted
    assert unit_module_counts(tmp_path) == {"tests/unit": 1, "tests/unit/app": 0, "tests/unit/app/views": LIMIT + 1}
    assert crowded(unit_module_counts(tmp_path), {}, "DEVELOPMENT.md") == [
        f"tests/unit/app/views/ holds {LIMIT + 1} modules, past {LIMIT} with no reason in DEVELOPMENT.md"]
    assert too_long(unit_line_counts(tmp_path), {}, "DEVELOPMENT.md") == [
        f"tests/unit/apptest.py holds {LINE_LIMIT + 1} lines, past {LINE_LIMIT} with no reason in DEVELOPMENT.md"]


def _package(root: Path, folder: str, modules: int) -> None:
    path = root / folder
    path.mkdir(parents=True)
    (path / "__init__.py").write_text("")
    for i in range(modules):
        (path / f"m{i}.py").write_text("")


@pytest.mark.parametrize(("modules", "design", "expected"), [
    (LIMIT, "", []),
    (LIMIT + 1, "", ["app/ holds 16 modules, past 15 with no reason"]),
    (LIMIT + 1, "## Folders past the limit\n\n- `app/` (16 modules): the pages grew, see issue 9.\n", []),
    (LIMIT + 2, "## Folders past the limit\n\n- `app/` (16 modules): the pages grew, see issue 9.\n",
     ["app/ holds 17 modules, past its ceiling of 16"]),
    # A reason of a word or two is no reason; one outside the section does not count.
    (LIMIT + 1, "## Folders past the limit\n\n- `app/` (16 modules): because.\n", ["app/ holds 16 modules, past 15"]),
    (LIMIT + 1, "## Elsewhere\n\n- `app/` (16 modules): the pages grew, see issue 9.\n",
     ["app/ holds 16 modules, past 15"]),
])
def test_a_crowded_folder_is_caught_unless_its_reason_is_written(tmp_path: Path, modules: int, design: str,
                                                                  expected: list[str]) -> None:
    _package(tmp_path, "app", modules)
    _package(tmp_path, "app/views", 2)
    _package(tmp_path, "db/migrations", LIMIT + 5)  # not a room: never counted
    counts = module_counts(tmp_path)
    assert counts == {"app": modules, "app/views": 2}
    problems = crowded(counts, exemptions(design))
    assert len(problems) == len(expected)
    assert all(p.startswith(e) for p, e in zip(problems, expected, strict=True))


_REASON = "## Modules past the limit\n\n- `app/big.py` (401 lines): a page drawn top to bottom.\n"


@pytest.mark.parametrize(("lines", "design", "expected"), [
    (LINE_LIMIT, "", []),
    (LINE_LIMIT + 1, "", ["app/big.py holds 401 lines, past 400 with no reason"]),
    (LINE_LIMIT + 1, _REASON, []),
    (LINE_LIMIT + 2, _REASON, ["app/big.py holds 402 lines, past its ceiling of 401"]),
    # A reason of a word or two is no reason; one under another heading (the folders') does not count.
    (LINE_LIMIT + 1, _REASON.replace("a page drawn top to bottom", "long"), ["app/big.py holds 401 lines, past 400"]),
    (LINE_LIMIT + 1, _REASON.replace("Modules", "Folders"), ["app/big.py holds 401 lines, past 400"]),
])
def test_a_long_module_is_caught_unless_its_reason_is_written(tmp_path: Path, lines: int, design: str,
                                                               expected: list[str]) -> None:
    _package(tmp_path, "app", 1)
    (tmp_path / "app" / "big.py").write_text("x = 1\n" * lines)
    _package(tmp_path, "db/migrations", 1)
    (tmp_path / "db" / "migrations" / "r001.py").write_text("x = 1\n" * (LINE_LIMIT + 5))  # Alembic's: never counted
    counts = line_counts(tmp_path)
    assert counts == {"app/__init__.py": 0, "app/m0.py": 0, "app/big.py": lines}
    problems = too_long(counts, long_modules(design))
    assert len(problems) == len(expected)
    assert all(p.startswith(e) for p, e in zip(problems, expected, strict=True))
