"""Metrics from what a script prints: the ``RUNYARD`` line protocol and the config's regexes.

The line protocol: a script prints one line per report,
``RUNYARD {"step": 10, "loss": 2.31, "lr": 0.0003}``: the word ``RUNYARD``, one space, and a JSON
object on one line, with ``step`` (an integer >= 0, the script's own step number) and numbers
for everything else, each a metric. Optional: ``rank`` (an integer >= 0; otherwise the rank of
the process that printed it) and ``total`` (an integer >= 1: the step the run will end at, for
its progress). torchrun's ``[rankN]:`` in front of a line is allowed. A line that starts with
``RUNYARD `` and breaks these rules is reported as a problem, naming the key and the value, and
skipped; no other line is looked at.

For scripts that only print, ``[workload.stdout_metrics]`` maps a metric name to a regular
expression with the named groups ``step`` and ``value``, e.g.
``loss = 'iter (?P<step>\\d+): loss (?P<value>[\\d.]+)'``; :func:`check_patterns` validates them
at submit.

:class:`LineTailer` reads a growing log file incrementally: it keeps the byte offset and the
partial last line, starts over when the file is truncated or replaced, and reads a bounded
number of bytes per call.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.scripts import Sample, ScriptWatchError

PREFIX = "RUNYARD "
PATTERNS_FIELD = "workload.stdout_metrics"
RESERVED = ("step", "rank", "total")
MAX_LINE_BYTES = 64 * 1024  # longer lines are cut (a protocol line that long is a problem)
MAX_KEY_CHARS = 200
MAX_PROBLEMS = 10  # per call: a script printing a bad line every step is told, not flooded
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:[ ]?")


class LineError(ScriptWatchError):
    """A ``RUNYARD`` line that breaks the protocol."""


class PatternError(ScriptWatchError):
    """A ``[workload.stdout_metrics]`` pattern that cannot be used."""


@dataclass(frozen=True)
class Report:
    """One protocol line.

    Attributes:
        rank: From the line's ``rank``, else torchrun's ``[rankN]:`` prefix, else the caller's.
        step: The script's step.
        values: Metric name -> value.
        total: The step the run will end at, when the line said.
    """

    rank: int
    step: int
    values: dict[str, float]
    total: int | None = None


def split_rank_prefix(line: str) -> tuple[int | None, str]:
    """``(N, rest)`` for a line torchrun prefixed with ``[rankN]:``, else ``(None, line)``. Of a
    line a progress bar rewrote with carriage returns, only the last part counts (what a terminal
    shows)."""
    if "\r" in line:
        line = next((part for part in reversed(line.split("\r")) if part), "")
    m = _RANK_PREFIX.match(line)
    if m is None:
        return None, line
    return int(m[1]), line[m.end():]


def _whole(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LineError(f"RUNYARD line: {what} must be an integer >= {minimum}, not {json.dumps(value)}")
    return value


def parse_protocol(line: str, default_rank: int) -> Report | None:
    """The report of one printed line, or None when it is not a protocol line.

    Args:
        line: One line of output, without its newline.
        default_rank: The rank of the process whose output it is.

    Raises:
        LineError: The line starts with ``RUNYARD `` but breaks the protocol; the message names
            the key and the value.
    """
    prefixed, text = split_rank_prefix(line)
    if not text.startswith(PREFIX):
        return None
    body = text[len(PREFIX):].strip()
    try:
        data = json.loads(body)
    except ValueError:
        raise LineError(f"RUNYARD line: not a JSON object: {body[:80]!r}") from None
    if not isinstance(data, dict):
        raise LineError(f"RUNYARD line: not a JSON object: {body[:80]!r}")
    if "step" not in data:
        raise LineError(f"RUNYARD line: no \"step\" in {body[:80]!r}")
    step = _whole(data["step"], '"step"', 0)
    rank = _whole(data["rank"], '"rank"', 0) if "rank" in data else (prefixed if prefixed is not None else default_rank)
    total = _whole(data["total"], '"total"', 1) if "total" in data else None
    values: dict[str, float] = {}
    for key, value in data.items():
        if key in RESERVED:
            continue
        if not key.strip() or len(key) > MAX_KEY_CHARS or any(ch in key for ch in "\n\r\t"):
            raise LineError(f"RUNYARD line: {json.dumps(key[:80])} is not a metric name (1 to {MAX_KEY_CHARS} "
                            "characters, no tabs or newlines)")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LineError(f"RUNYARD line: {json.dumps(key)} must be a number, not {json.dumps(value)[:80]}")
        values[key] = float(value)
    return Report(rank=rank, step=step, values=values, total=total)


# -- regexes -------------------------------------------------------------------------------------


def check_patterns(patterns: Mapping[str, Any], field_name: str = PATTERNS_FIELD) -> list[str]:
    """Every problem of ``[workload.stdout_metrics]``, each naming the key: not a string, does
    not compile, lacks the ``step`` or ``value`` group, or matches an empty line (and so every
    line). Empty when all can be used."""
    problems = []
    for name, pattern in patterns.items():
        where = f"{field_name}.{name}"
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_KEY_CHARS or name in RESERVED:
            problems.append(f"{field_name}: {name!r} is not a metric name (1 to {MAX_KEY_CHARS} characters, "
                            f"not {', '.join(RESERVED)})")
            continue
        if not isinstance(pattern, str):
            problems.append(f"{where} must be a string (a regular expression), not {pattern!r}")
            continue
        shown = f"'{pattern}'"  # as written in the TOML file (a literal string): no doubled backslashes
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            problems.append(f"{where} = {shown} is not a regular expression: {exc}")
            continue
        missing = [g for g in ("step", "value") if g not in compiled.groupindex]
        if missing:
            groups = " and ".join(f"(?P<{g}>...)" for g in missing)
            problems.append(f"{where} = {shown} has no named group {groups}; for example "
                            r"'iter (?P<step>\d+): loss (?P<value>[\d.eE+-]+)'")
        elif compiled.search("") is not None:
            problems.append(f"{where} = {shown} matches an empty line, so it would match every line")
    return problems


def compile_patterns(patterns: Mapping[str, Any] | None,
                     field_name: str = PATTERNS_FIELD) -> dict[str, re.Pattern[str]]:
    """The compiled patterns.

    Raises:
        PatternError: With every problem :func:`check_patterns` finds, one per line.
    """
    if not patterns:
        return {}
    problems = check_patterns(patterns, field_name)
    if problems:
        raise PatternError("\n".join(problems))
    return {name: re.compile(pattern) for name, pattern in patterns.items()}


def match_patterns(text: str, patterns: Mapping[str, re.Pattern[str]], rank: int,
                   wall_time: float) -> tuple[list[Sample], list[str]]:
    """The samples the patterns find in one line (its rank prefix already off), and the problems:
    a match whose ``step`` is not an integer >= 0 or whose ``value`` is not a number."""
    samples, problems = [], []
    for name, pattern in patterns.items():
        m = pattern.search(text)
        if m is None:
            continue
        step_text, value_text = m["step"], m["value"]
        try:
            step = int(step_text)
            value = float(value_text)
        except (TypeError, ValueError):
            problems.append(f"{PATTERNS_FIELD}.{name} matched {text[:80]!r} but step {step_text!r} is not an "
                            f"integer or value {value_text!r} is not a number")
            continue
        if step < 0:
            problems.append(f"{PATTERNS_FIELD}.{name} matched {text[:80]!r} with a negative step {step}")
            continue
        samples.append(Sample(rank, step, name, value, wall_time))
    return samples, problems


# -- parsing what a file gave --------------------------------------------------------------------


@dataclass
class Parsed:
    """What some lines of output held.

    Attributes:
        samples: Every metric value found.
        total: The newest ``total`` a protocol line gave.
        newest_step: The largest step seen per source: ``"protocol"`` and ``"stdout_metrics"``.
        problems: At most ``MAX_PROBLEMS`` distinct problems, in order.
        skipped: How many lines had a problem.
        saved: The last line that says a checkpoint was saved (:data:`SAVED_LINE`), or None.
    """

    samples: list[Sample] = field(default_factory=list)
    total: int | None = None
    newest_step: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    skipped: int = 0
    saved: str | None = None

    def _problem(self, message: str) -> None:
        self.skipped += 1
        if message not in self.problems and len(self.problems) < MAX_PROBLEMS:
            self.problems.append(message)

    def _step(self, source: str, step: int) -> None:
        self.newest_step[source] = max(step, self.newest_step.get(source, step))


# A line that says the script saved a checkpoint, as the frameworks print it: Hugging Face's
# "Saving model checkpoint to hf_out/checkpoint-350", nanoGPT's "saving checkpoint to out", the DDP
# tutorial's "Training snapshot saved at snapshot.pt", Lightning's "Epoch 3, global step 300:
# 'val_loss' reached 0.25 (best 0.25), saving model to ...".
SAVED_LINE = re.compile(
    r"\bsav(?:e|ed|ing)\b.{0,40}\b(?:checkpoint|ckpt|snapshot|model)s?\b"
    r"|\b(?:checkpoint|ckpt|snapshot)s?\b.{0,40}\bsaved\b", re.IGNORECASE)


def parse_lines(lines: Iterable[str], default_rank: int, wall_time: float,
                patterns: Mapping[str, re.Pattern[str]] | None = None) -> Parsed:
    """The protocol lines and pattern matches of some lines of one rank's output.

    Args:
        lines: The lines, without newlines.
        default_rank: The rank whose output it is (a line's prefix or ``rank`` wins).
        wall_time: The time given to every sample (the file's modification time).
        patterns: Compiled ``[workload.stdout_metrics]``; not tried on protocol lines.
    """
    out = Parsed()
    for line in lines:
        try:
            report = parse_protocol(line, default_rank)
        except LineError as exc:
            out._problem(str(exc))
            continue
        if report is not None:
            out.samples.extend(Sample(report.rank, report.step, k, v, wall_time) for k, v in report.values.items())
            out._step("protocol", report.step)
            if report.total is not None:
                out.total = report.total
            continue
        if patterns:
            prefixed, text = split_rank_prefix(line)
            found, problems = match_patterns(text, patterns, default_rank if prefixed is None else prefixed, wall_time)
            for problem in problems:
                out._problem(problem)
            out.samples.extend(found)
            for sample in found:
                out._step("stdout_metrics", sample.step)
        if SAVED_LINE.search(line):
            out.saved = line.strip()[:200]
    return out


# -- the tailer ----------------------------------------------------------------------------------


class LineTailer:
    """The new complete lines of a growing file, a bounded number of bytes per call.

    Args:
        path: The file; it may not exist yet.
        max_bytes: The most bytes one :meth:`read` takes; the rest waits for the next call.
        max_line: Longer lines are cut to this many bytes (the rest of the line is dropped).
    """

    def __init__(self, path: Path, max_bytes: int = 1 << 20, max_line: int = MAX_LINE_BYTES):
        self.path = path
        self.max_bytes = max_bytes
        self.max_line = max_line
        self.offset = 0
        self.size = 0
        self.grew_at: float | None = None  # the file's modification time when it last grew
        self.restarts = 0  # times the file was truncated or replaced
        self._partial = b""
        self._dropping = False  # inside the rest of a line longer than max_line
        self._identity: tuple[int, int] | None = None

    @property
    def behind(self) -> bool:
        """More bytes are waiting than the last call read."""
        return self.size > self.offset

    def read(self, final: bool = False) -> list[str]:
        """The complete lines written since the last call (and, with ``final``, the unfinished
        last line too: the process has ended)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        identity = (st.st_dev, st.st_ino)
        if self._identity is not None and (identity != self._identity or st.st_size < self.offset):
            # Replaced (rotated) or truncated: the new content starts at byte 0.
            self.offset, self._partial, self._dropping = 0, b"", False
            self.restarts += 1
        self._identity, self.size = identity, st.st_size
        data = b""
        if st.st_size > self.offset:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read(self.max_bytes)
            except OSError:
                return []
            self.offset += len(data)
            self.grew_at = st.st_mtime
        return self._lines(data, final)

    def _lines(self, data: bytes, final: bool) -> list[str]:
        buf = self._partial + data
        if self._dropping:  # the rest of a line already cut: skip to its end
            end = buf.find(b"\n")
            if end < 0:
                self._partial = b""
                return []
            buf, self._dropping = buf[end + 1:], False
        chunks = buf.split(b"\n")
        self._partial = chunks.pop()
        if final and self._partial:
            chunks.append(self._partial)
            self._partial = b""
        lines = [chunk[:self.max_line].decode("utf-8", errors="replace").rstrip("\r") for chunk in chunks]
        if len(self._partial) > self.max_line:
            lines.append(self._partial[:self.max_line].decode("utf-8", errors="replace"))
            self._partial, self._dropping = b"", True
        return lines
