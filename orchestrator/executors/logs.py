"""Finding and reading the per-rank log files of an attempt."""

from __future__ import annotations

import json
from pathlib import Path

from db.vocabulary.layout import LAUNCHER_LOG, RANK_LOG_DIR, RANK_MAP_FILE


def rank_log_files(attempt_dir: Path) -> dict[int, list[Path]]:
    """``{global rank: [stdout.log, stderr.log]}`` for one attempt.

    torchrun's layout is ``ranks/<rdzv>_<random>/attempt_<k>/<local_rank>/std{out,err}.log`` for
    one node, and the same under ``ranks/node-<n>/`` for each node of a multi-node run (one
    torchrun agent each). Folders are named by local rank; the ``ranks.json`` that
    trainer/agent/torchrun.py writes beside them says which global rank each one is. Without it (a run
    from before, or an agent killed before it wrote it) a single node's local rank is the global
    rank, and another node's folder is left out rather than shown under the wrong rank.
    """
    out: dict[int, list[Path]] = {}
    root = attempt_dir / RANK_LOG_DIR
    for pattern in ("*/attempt_*/*/std*.log", "node-*/*/attempt_*/*/std*.log"):
        for path in sorted(root.glob(pattern)):
            rank = _global_rank(path.parent, multi_node=pattern.startswith("node-"))
            if rank is not None:
                out.setdefault(rank, []).append(path)
    return dict(sorted(out.items()))


def _global_rank(folder: Path, multi_node: bool) -> int | None:
    """The global rank of a local-rank log folder, or None when it cannot be told."""
    try:
        local = int(folder.name)
    except ValueError:
        return None
    try:
        mapping = json.loads((folder.parent / RANK_MAP_FILE).read_text())
        return int(mapping[str(local)])
    except (OSError, ValueError, KeyError, TypeError):
        return None if multi_node else local


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
