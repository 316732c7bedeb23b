"""The line every bench script ends with: its row of BENCHMARKS.md's table, filled in.

    BENCHMARKS.md row: | **Name**: what it measures | `.venv/bin/python bench/X.py` | result | 1.2 -> 2.3 | 2026-12-02 |

Bringing the table up to date is pasting that line, less its ``BENCHMARKS.md row: `` prefix, over
the row of the same name. The command is the one the script was started with (a database
password masked), the load is the 1-minute load average when the script started and when it
ended (its own work included), and the date is today's. A script reads
:func:`load_average` first thing and passes it to :func:`print_row` at the end.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "BENCHMARKS.md row: "
_PASSWORD = re.compile(r"(://[^/:@\s]+:)[^@\s]+@")


def load_average() -> float:
    """The machine's 1-minute load average now."""
    return os.getloadavg()[0]


def verdict(met: bool) -> str:
    """How a row says whether a target was met."""
    return "met" if met else "**missed**"


def command() -> str:
    """This process's command line as a person reruns it from the repository root, with any
    database password in it masked."""
    interpreter = Path(os.path.abspath(sys.executable))  # not resolved: .venv/bin/python is a link
    shown = str(interpreter.relative_to(ROOT)) if interpreter.is_relative_to(ROOT) else "python"
    script = Path(os.path.abspath(sys.argv[0]))
    if script.is_relative_to(ROOT):
        script = script.relative_to(ROOT)
    return shlex.join([shown, str(script), *(_PASSWORD.sub(r"\1***@", arg) for arg in sys.argv[1:])])


def row(name: str, what: str, result: str, load_at_start: float) -> str:
    """The table row: ``name`` and ``what`` the benchmark measures, this process's command, the
    ``result``, the load average from ``load_at_start`` to now, and today's date."""
    cells = (f"**{name}**: {what}", f"`{command()}`", result, f"{load_at_start:.1f} -> {load_average():.1f}",
             datetime.date.today().isoformat())
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def print_row(name: str, what: str, result: str, load_at_start: float) -> None:
    """Print :func:`row` behind the ``BENCHMARKS.md row: `` prefix (see the module docstring)."""
    print(PREFIX + row(name, what, result, load_at_start), flush=True)
