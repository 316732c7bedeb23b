"""Which health checks ran on an attempt: the vocabulary shared by the ranks that record it and
the pages that read it.

Rank 0 records one ``checks`` event per attempt at its first metrics log (trainer/reporting/monitoring.py):
whether the straggler and desync checks run, and why not where one does not (one rank, FSDP,
a script that never called ``run.watch(model)``...). The Run page reads the newest such event so
that it says "not checked" where a check did not run instead of "none found". Hangs and NaNs
are judged by the scheduler and from the stored metrics, and need no event.
"""

from __future__ import annotations

from collections.abc import Mapping

CHECKS_EVENT = "checks"
RANK_CHECKS = ("stragglers", "desyncs")
ALL_CHECKED = "stragglers and desyncs are checked"
_NOT = " not checked: "


def checks_message(unchecked: Mapping[str, str]) -> str:
    """The event's message from {check: why it does not run} (empty: both run).

    >>> checks_message({"stragglers": "one rank"})
    'stragglers not checked: one rank; desyncs checked'
    """
    if not unchecked:
        return ALL_CHECKED
    parts = [f"{what}{_NOT}{unchecked[what]}" for what in RANK_CHECKS if what in unchecked]
    return "; ".join(parts + [f"{what} checked" for what in RANK_CHECKS if what not in unchecked])


def parse_checks(message: str) -> dict[str, str | None]:
    """The message back into {check: None where it runs, else why not}.

    >>> parse_checks("stragglers not checked: one rank; desyncs checked")
    {'stragglers': 'one rank', 'desyncs': None}
    """
    if message == ALL_CHECKED:
        return dict.fromkeys(RANK_CHECKS)
    out: dict[str, str | None] = {}
    for part in message.split("; "):
        what, sep, why = part.partition(_NOT)
        if sep:
            out[what] = why
        elif part.endswith(" checked"):
            out[part.removesuffix(" checked")] = None
    return out
