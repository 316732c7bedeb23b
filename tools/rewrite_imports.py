"""Rewrite imports, dotted module strings and slash paths in files per MOVES.txt.

    python tools/rewrite_imports.py [--moves MOVES.txt] [--check] FILE...

MOVES.txt holds one move a line (``#`` starts a comment):

- ``old.module -> new.module``: the module and everything in it moved;
- ``old.module:Name -> new.module:Name``: one name moved out of a module that went elsewhere
  (or stayed);
- ``old/dir/ -> new/dir/``: a package's folder moved, for paths that name the folder.

What is rewritten, in any text file (code, TOML, Markdown, Dockerfile):

- ``from X import a, b as c`` (one line, backslash-continued or parenthesized): each name goes to
  where it now lives, and a statement whose names now live in several modules becomes one
  statement per module; ``from pkg import module`` of a moved module becomes
  ``from newpkg import newname as module`` when the name changed, so the code below still reads;
- every other dotted name that starts with a moved module: ``import X``, ``python -m X``,
  monkeypatch targets such as ``"X.time.sleep"``, entry points ``X:main``;
- slash paths: ``pkg/mod.py`` and ``pkg/dir/`` (pyproject globs, docs, docstrings).

A name that already starts with a new module (longer than any old one it starts with) is left
alone, so running the tool twice changes nothing the second time. Two readings it cannot tell
apart:

- a bare package name that was a module before (``orchestrator.scheduler``) reads as the old
  module: a line that means the package says ``rewrite-imports: keep`` and is left alone;
- ``from pkg import X``, where ``pkg`` was a module and is now a package with a module ``X``,
  reads as the new module: MOVES.txt must not give a package a module named like a name of the
  module it replaces (why cli.py became cli/group.py, not cli/main.py: ``from orchestrator.cli
  import main`` imported the function).

Reports each changed file; with ``--check`` writes nothing and exits 1 when a file would change.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOTS = ("app", "orchestrator", "trainer", "db", "tests")
LINE_LIMIT = 120
_ROOTS = "|".join(ROOTS)
_FROM = re.compile(
    r"^(?P<indent>[ \t]*)from[ \t]+(?P<mod>(?:" + _ROOTS + r")(?:\.\w+)*)[ \t]+import[ \t]+"
    r"(?:\((?P<paren>[^)]*)\)|(?P<plain>(?:[^\n#\\]|\\\n)+))(?P<tail>[^\n]*)",
    re.MULTILINE,
)
_DOTTED = re.compile(r"(?<![\w.])(?:" + _ROOTS + r")(?:\.[A-Za-z_]\w*)+")
_SLASHED = re.compile(r"(?<![\w.-])(?P<path>(?:" + _ROOTS + r")(?:/[A-Za-z_]\w*)+)(?P<suffix>\.py\b|/)?")


@dataclass
class Moves:
    modules: dict[str, str] = field(default_factory=dict)  # old.module -> new.module
    names: dict[str, str] = field(default_factory=dict)  # old.module.Name -> new.module (the name is kept)
    folders: dict[str, str] = field(default_factory=dict)  # old/dir -> new/dir
    new_modules: set[str] = field(default_factory=set)
    new_packages: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, path: Path) -> Moves:
        moves = cls()
        for number, raw in enumerate(path.read_text().splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            old, arrow, new = line.partition(" -> ")
            old, new = old.strip(), new.strip()
            if not arrow or not old or not new:
                raise SystemExit(f"{path}:{number}: expected 'old -> new', got {raw!r}")
            if old.endswith("/"):
                moves.folders[old.rstrip("/")] = new.rstrip("/")
            elif ":" in old:
                old_mod, _, old_name = old.partition(":")
                new_mod, _, new_name = new.partition(":")
                if old_name != new_name:
                    raise SystemExit(f"{path}:{number}: a moved name keeps its name: {raw!r}")
                moves.names[f"{old_mod}.{old_name}"] = new_mod
                moves.new_modules.add(new_mod)
            else:
                moves.modules[old] = new
                moves.new_modules.add(new)
        for folder in moves.folders.values():
            moves.new_packages.add(folder.replace("/", "."))
        for module in list(moves.new_modules):
            parts = module.split(".")
            moves.new_packages.update(".".join(parts[:i]) for i in range(1, len(parts)))
        return moves

    def _longest(self, parts: list[str], table: dict[str, str] | set[str]) -> int:
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in table:
                return n
        return 0

    def dotted(self, name: str) -> str:
        """``name`` with the longest moved prefix replaced; unchanged if it is already new."""
        parts = name.split(".")
        old_mod = self._longest(parts, self.modules)
        old_name = self._longest(parts, self.names)
        new = max(self._longest(parts, self.new_modules), self._longest(parts, self.new_packages))
        if max(old_mod, old_name) == 0 or new > max(old_mod, old_name):
            return name
        if old_name > old_mod:  # a moved name: old.module.Name[.attr] -> new.module.Name[.attr]
            return ".".join([self.names[".".join(parts[:old_name])], *parts[old_name - 1:]])
        return ".".join([self.modules[".".join(parts[:old_mod])], *parts[old_mod:]])

    def is_module(self, dotted: str) -> bool:
        return dotted in self.modules or dotted in self.new_modules or dotted in self.new_packages

    def path(self, path: str, suffix: str | None) -> str:
        parts = path.split("/")
        if suffix == ".py":
            if parts[-1] == "__init__":
                parts = parts[:-1]
            old = ".".join(parts)
            new = self.dotted(old)
            if new == old:
                return path + suffix
            tail = "/__init__.py" if new in self.new_packages else ".py"
            return new.replace(".", "/") + tail
        for n in range(len(parts), 0, -1):
            head = "/".join(parts[:n])
            if head in self.folders:
                return "/".join([self.folders[head], *parts[n:]]) + (suffix or "")
        # A module path without .py (``orchestrator/scheduler`` in prose) is left as it is.
        return path + (suffix or "")


def _names(text: str) -> list[tuple[str, str | None]]:
    text = re.sub(r"#[^\n]*", "", text).replace("\\\n", " ")
    out = []
    for item in text.split(","):
        item = " ".join(item.split())
        if not item:
            continue
        name, _, alias = item.partition(" as ")
        out.append((name.strip(), alias.strip() or None))
    return out


def _statement(indent: str, module: str, names: list[str], paren: bool, tail: str) -> str:
    one = f"{indent}from {module} import {', '.join(names)}{tail}"
    if not paren and len(one) <= LINE_LIMIT:
        return one
    body = "".join(f"{indent}    {name},\n" for name in names)
    return f"{indent}from {module} import (\n{body}{indent}){tail}"


def _rewrite_from(moves: Moves, match: re.Match[str]) -> str:
    indent, module = match["indent"], match["mod"]
    paren = match["paren"] is not None
    body = match["paren"] if paren else match["plain"]
    tail = match["tail"] or ""
    if not paren:  # keep what follows the names (a comment) as it was
        stripped = body.rstrip()
        tail = body[len(stripped):] + tail
        body = stripped
    names = _names(body)
    if not names or any(name == "*" for name, _ in names):
        return match.group(0)
    groups: dict[str, list[str]] = {}
    for name, alias in names:
        full = f"{module}.{name}"
        if moves.is_module(full):  # ``from pkg import module``
            new_full = moves.dotted(full)
            target, _, new_name = new_full.rpartition(".")
            if new_name != name and alias is None:
                alias = name
        else:  # a name defined in the module: where the module went, or where the name went
            new_name = name
            target = moves.names.get(full) or moves.dotted(module)
        groups.setdefault(target, []).append(new_name if alias in (None, new_name) else f"{new_name} as {alias}")
    if list(groups) == [module] and groups[module] == [n if a is None else f"{n} as {a}" for n, a in names]:
        return match.group(0)
    # One statement per module, in the order the names came; a trailing comment stays on the first.
    statements = []
    for i, (target, group) in enumerate(groups.items()):
        statements.append(_statement(indent, target, group, paren, tail if i == 0 else ""))
    return "\n".join(statements)


KEEP = "rewrite-imports: keep"


def rewrite(moves: Moves, text: str) -> str:
    """``text`` with every moved import, dotted name and slash path rewritten, but on the lines
    that say ``rewrite-imports: keep``."""
    lines = text.split("\n")
    kept = {}
    for i, line in enumerate(lines):
        if KEEP in line:
            kept[f"\0kept{i}\0"] = line
            lines[i] = f"\0kept{i}\0"
    out = _rewrite("\n".join(lines), moves)
    for token, line in kept.items():
        out = out.replace(token, line, 1)
    return out


def _rewrite(text: str, moves: Moves) -> str:
    pieces: list[str] = []
    last = 0
    for match in _FROM.finditer(text):
        pieces.append(_rewrite_rest(moves, text[last:match.start()]))
        pieces.append(_rewrite_from(moves, match))
        last = match.end()
    pieces.append(_rewrite_rest(moves, text[last:]))
    return "".join(pieces)


def _rewrite_rest(moves: Moves, text: str) -> str:
    text = _DOTTED.sub(lambda m: moves.dotted(m.group(0)), text)
    return _SLASHED.sub(lambda m: moves.path(m["path"], m["suffix"]), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--moves", type=Path, default=Path(__file__).resolve().parents[1] / "MOVES.txt")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    moves = Moves.read(args.moves)
    changed = 0
    for path in args.files:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, IsADirectoryError):
            continue  # not a text file
        except FileNotFoundError:
            print(f"no such file: {path}", file=sys.stderr)
            continue
        new = rewrite(moves, text)
        if new != text:
            changed += 1
            print(f"{'would rewrite' if args.check else 'rewrote'} {path}")
            if not args.check:
                path.write_text(new)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
