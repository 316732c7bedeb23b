"""Finding and reading the per-rank log files of an attempt."""

from __future__ import annotations

from pathlib import Path

from db.layout import LAUNCHER_LOG, RANK_LOG_DIR


def rank_log_files(attempt_dir: Path) -> dict[int, list[Path]]:
    """``{rank: [stdout.log, stderr.log]}`` for one attempt (torchrun's layout:
    ranks/<rdzv>_<random>/attempt_<k>/<local_rank>/std{out,err}.log)."""
    out: dict[int, list[Path]] = {}
    for path in sorted((attempt_dir / RANK_LOG_DIR).glob("*/attempt_*/*/std*.log")):
        try:
            rank = int(path.parent.name)
        except ValueError:
            continue
        out.setdefault(rank, []).append(path)
    return dict(sorted(out.items()))


def launcher_log(attempt_dir: Path) -> Path:
    return attempt_dir / LAUNCHER_LOG


def tail(path: Path, max_bytes: int = 8192) -> str:
    """The last ``max_bytes`` of a file, from a line start; empty if it does not exist."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    text = data.decode(errors="replace")
    if size > max_bytes and "\n" in text:
        text = text.split("\n", 1)[1]
    return text
