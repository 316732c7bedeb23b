"""Rooms stay small and named: no package folder holds more than LIMIT modules directly unless
docs/DESIGN.md gives the reason and a ceiling ("Folders past the limit"), no module passes
LINE_LIMIT lines unless DESIGN.md gives the reason and a ceiling ("Modules past the limit"), and
DESIGN.md's table of folders names every package folder there is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
PACKAGES = ("app", "orchestrator", "trainer", "db")
LIMIT = 15
LINE_LIMIT = 400
# Not rooms of runyard's code: Alembic's migration scripts, the wandb stand-in put on a script's path.
SKIP_PARTS = {"migrations", "shims", "__pycache__"}
# "- `db/` (23 modules): the reason ..." in the section "Folders past the limit".
_EXEMPTION = re.compile(r"^- `(?P<folder>[\w/]+)/` \((?P<ceiling>\d+) modules\): (?P<reason>\S.*)$")
# "- `db/models.py` (424 lines): the reason ..." in the section "Modules past the limit".
_LONG_MODULE = re.compile(r"^- `(?P<module>[\w/]+\.py)` \((?P<ceiling>\d+) lines\): (?P<reason>\S.*)$")


def module_counts(root: Path) -> dict[str, int]:
    """Package folder (relative, no trailing slash) -> its modules directly in it, not ``__init__.py``."""
    counts = {}
    for package in PACKAGES:
        for folder in [root / package, *sorted(p for p in (root / package).rglob("*") if p.is_dir())]:
            relative = folder.relative_to(root)
            if SKIP_PARTS & set(relative.parts) or not (folder / "__init__.py").exists():
                continue
            counts[relative.as_posix()] = sum(1 for f in folder.glob("*.py") if f.name != "__init__.py")
    return counts


def line_counts(root: Path) -> dict[str, int]:
    """Module (relative path) -> its lines, for every module of the packages and runyard.py;
    Alembic's migration scripts are not runyard's modules."""
    paths = [root / "runyard.py", *(p for package in PACKAGES for p in sorted((root / package).rglob("*.py")))]
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


def exemptions(design: str) -> dict[str, int]:
    """Folder -> the ceiling docs/DESIGN.md gives it, with a reason, under "Folders past the limit"."""
    return _listed(design, "Folders past the limit", _EXEMPTION, "folder")


def long_modules(design: str) -> dict[str, int]:
    """Module -> the ceiling docs/DESIGN.md gives it, with a reason, under "Modules past the limit"."""
    return _listed(design, "Modules past the limit", _LONG_MODULE, "module")


def _past(counts: dict[str, int], allowed: dict[str, int], limit: int, what: str, section: str) -> list[str]:
    """Each of ``counts`` past ``limit`` without a reason under ``section``, or past the ceiling its
    reason gives; ``what`` says what is counted ("modules", "lines")."""
    problems = []
    for name, count in sorted(counts.items()):
        ceiling = allowed.get(name, limit)
        if count > ceiling:
            why = (f"past its ceiling of {ceiling} in docs/DESIGN.md" if name in allowed
                   else f"past {limit} with no reason in docs/DESIGN.md's \"{section}\"")
            problems.append(f"{name} holds {count} {what}, {why}")
    return problems


def too_long(counts: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """Each module past LINE_LIMIT without a reason, or past the ceiling its reason gives."""
    return _past(counts, allowed, LINE_LIMIT, "lines", "Modules past the limit")


def crowded(counts: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """Each folder past LIMIT without a reason, or past the ceiling its reason gives."""
    shown = {f"{folder}/": count for folder, count in counts.items()}
    return _past(shown, {f"{folder}/": ceiling for folder, ceiling in allowed.items()}, LIMIT, "modules",
                 "Folders past the limit")


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
