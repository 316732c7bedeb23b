"""The Run page's logs (its Logs section): one rank's log of an attempt at a time, read from the
run's folder (orchestrator/executors/logs.py), that a person can search (every matching line,
the matches highlighted), filter by level (error, warning, info, read from each line's text),
follow live at its end, open at its first error, and download (that rank's log, or every rank's
and the launcher's of every attempt as a zip). A traceback reads from the user's code: each run
of runyard's own frames (its trainer and orchestrator, the script shims) is folded into one line.

A log is text the run controls: every line is HTML-escaped here, and only this module's own
markup (line numbers, ``<mark>``, the error line's class) reaches the page, through ``st.html``
(which runs no script either); nothing of it is read as Markdown. The text functions are plain;
:func:`log_panel` draws them inside the page's live fragment.
"""

from __future__ import annotations

import html
import io
import re
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from app import style
from orchestrator.executors.logs import launcher_log, rank_log_files

# What is read of a log to search it or find its first error: its end, when it is larger.
MAX_READ_BYTES = 4 * 1024 * 1024
TAIL_BYTES = 256 * 1024  # what the view of the end reads, every refresh while it follows
COUNT_LINES_BYTES = 64 * 1024 * 1024  # lines are numbered as in the file up to this much before the end read
TAIL_LINES = 300  # lines shown at the end of a log
BEFORE_ERROR, AFTER_ERROR = 15, 250  # lines shown around the first error
MAX_MATCHES = 500  # matching lines shown (the count says how many there are)
LAUNCHER = "launcher"
LEVELS = ("error", "warning", "info")  # a line's level, read from its text (:func:`line_levels`)


@dataclass(frozen=True)
class LogText:
    """What was read of one log file: its lines and the number of the first (1-based)."""

    name: str
    lines: list[str]
    first_line: int | None = 1  # None: not known (the end of a very long file)
    cut: bool = False  # the file is longer: only its end was read

    def numbered(self) -> list[tuple[int | None, str]]:
        first = self.first_line
        return [(first + i if first is not None else None, line) for i, line in enumerate(self.lines)]


def read_log(path: Path, max_bytes: int = MAX_READ_BYTES) -> LogText:
    """The end of ``path`` (at most ``max_bytes``, from a line start), its lines numbered as in the
    file (counted up to ``COUNT_LINES_BYTES`` before what is read; beyond, not numbered); empty
    when it does not exist."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            start = max(0, size - max_bytes)
            before: int | None = 0
            if 0 < start <= COUNT_LINES_BYTES:  # the lines before what is read: the file's numbers
                f.seek(0)
                before = f.read(start).count(b"\n")
            elif start:
                before = None
            f.seek(start)
            data = f.read()
    except OSError:
        return LogText(path.name, [])
    text = data.decode(errors="replace")
    if start and "\n" in text:  # the first line read is a part of one: left out
        text = text.split("\n", 1)[1]
        before = before + 1 if before is not None else None
    return LogText(path.name, text.splitlines(), first_line=before + 1 if before is not None else None,
                   cut=start > 0)


def error_line(line: str) -> bool:
    """Whether a log line reads as an error: a traceback's start or an exception (``ValueError:``,
    ``torch.OutOfMemoryError``), with torchrun's ``[rankN]:`` prefix or without."""
    stripped = bare(line).strip()
    return stripped.startswith("Traceback") or re.match(
        r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", stripped) is not None


def first_error(lines: Sequence[str]) -> int | None:
    """The index of the first error line of ``lines``, or None."""
    return next((i for i, line in enumerate(lines) if error_line(line)), None)


_RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]: ?")
# A traceback's frame line: its indentation, file, line number and function (when it names one).
FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?')


def bare(line: str) -> str:
    """``line`` without torchrun's ``[rankN]: `` prefix (its indentation kept)."""
    return _RANK_PREFIX.sub("", line, count=1)


def line_rank(line: str) -> int | None:
    """The rank of torchrun's ``[rankN]:`` prefix on ``line``; None without one."""
    m = _RANK_PREFIX.match(line)
    return int(m["rank"]) if m else None


def line_levels(lines: Sequence[str]) -> list[str]:
    """Each line's level as its text says it: ``error`` (a traceback, from its first line to its
    exception, and lines that say ERROR, CRITICAL or FATAL), ``warning`` (WARNING, WARN, a
    ``...Warning:``), else ``info``."""
    out, in_traceback = [], False
    for line in lines:
        text = bare(line)
        if text.strip().startswith("Traceback"):
            in_traceback = True
        if in_traceback or error_line(line) or re.search(r"\b(ERROR|CRITICAL|FATAL)\b", text):
            out.append("error")
            # A traceback ends at its exception line: the first that is not indented and not a
            # chained traceback's "During handling..." / "The above exception..." line.
            chained = ("Traceback", "During handling", "The above exception")
            if in_traceback and text[:1] not in (" ", "\t", "") and not text.startswith(chained):
                in_traceback = False
        elif re.search(r"\bWARN(ING)?\b|\w*Warning\b", text):
            out.append("warning")
        else:
            out.append("info")
    return out


# The folders whose frames are runyard's own (beside this package: the trainer that runs a user's
# script, the orchestrator with the script shims), and the frames of runpy that runyard's script
# runner calls through: folded when they sit with runyard's.
OWN_FRAME_ROOTS = tuple(str(Path(__file__).resolve().parents[1] / name) + "/" for name in ("trainer", "orchestrator"))


def _frame_kind(path: str, roots: Sequence[str]) -> str | None:
    if path.startswith(tuple(roots)):
        return "runyard"
    return "runpy" if path in ("<frozen runpy>",) or path.endswith("/runpy.py") else None


def _short(path: str, roots: Sequence[str]) -> str:
    """A runyard frame's file from its package folder on: ``trainer/script_runner.py``."""
    root = next(r for r in roots if path.startswith(r))
    return root.rstrip("/").rsplit("/", 1)[-1] + "/" + path[len(root):]


def fold_frames(numbered: Sequence[tuple[int | None, str]],
                roots: Sequence[str] = OWN_FRAME_ROOTS) -> list[tuple[int | None, str]]:
    """``numbered`` lines with each run of runyard's own traceback frames (a frame's ``File``
    line and its source lines under it) folded into one line, "N runyard frames", so that a
    traceback reads from the user's code. runpy's frames between runyard's are counted in."""
    out: list[tuple[int | None, str]] = []
    i = 0
    while i < len(numbered):
        run: list[str] = []  # the frames' paths, in order
        j = i
        while j < len(numbered) and (m := FRAME.match(bare(numbered[j][1]))) and _frame_kind(m["file"], roots):
            indent, run = len(m["indent"]), [*run, m["file"]]
            j += 1
            while j < len(numbered) and len(bare(numbered[j][1])) - len(bare(numbered[j][1]).lstrip()) > indent:
                j += 1  # the frame's source line and its ^^^ marks
        if any(_frame_kind(path, roots) == "runyard" for path in run):
            line = numbered[i][1]
            prefix = line[:len(line) - len(bare(line))]
            indent_text = bare(line)[:len(bare(line)) - len(bare(line).lstrip())]
            names = sorted({_short(path, roots) for path in run if _frame_kind(path, roots) == "runyard"})
            frames = "frame" if len(run) == 1 else "frames"
            out.append((None, f"{prefix}{indent_text}… {len(run)} runyard {frames} ({', '.join(names)})"))
            i = j
        else:
            out.append(numbered[i])
            i += 1
    return out


def fold_text(text: str, roots: Sequence[str] = OWN_FRAME_ROOTS) -> str:
    """``text`` with runyard's own traceback frames folded (:func:`fold_frames`)."""
    return "\n".join(line for _, line in fold_frames([(None, line) for line in text.splitlines()], roots))


def matching(lines: Sequence[str], query: str) -> list[int]:
    """The indexes of the lines that hold ``query`` (plain text, any case)."""
    needle = query.casefold()
    return [i for i, line in enumerate(lines) if needle in line.casefold()] if needle else []


def _highlight(line: str, query: str) -> str:
    """``line`` escaped for HTML, each occurrence of ``query`` (any case) in ``<mark>``."""
    if not query:
        return html.escape(line)
    parts = re.split(f"({re.escape(query)})", line, flags=re.IGNORECASE)
    return "".join(f"<mark>{html.escape(p)}</mark>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def log_html(numbered: Iterable[tuple[int | None, str]], query: str = "", error_at: int | None = None,
             follow: bool = False) -> str:
    """Lines as the page shows them: a scrolling box (kept at its end when ``follow``), each line
    with its number, the matches of ``query`` marked, the line numbered ``error_at`` marked as the
    error. Everything from the log is escaped."""
    rows = []
    for number, line in numbered:
        css = ' class="runyard-log-error"' if number is not None and number == error_at else ""
        no = "" if number is None else number
        rows.append(f'<span{css}><span class="runyard-log-no">{no}</span>{_highlight(line, query)}</span>')
    body = "\n".join(rows) or '<span class="runyard-log-no"></span>(empty)'
    return f'<div class="runyard-log{" runyard-log-follow" if follow else ""}"><pre>{body}</pre></div>'


def log_sources(attempt_dir: Path) -> dict[str, list[Path]]:
    """The logs of one attempt by name: ``rank N`` (its stdout and stderr), then the launcher's."""
    sources = {f"rank {rank}": paths for rank, paths in rank_log_files(attempt_dir).items()}
    sources[LAUNCHER] = [launcher_log(attempt_dir)]
    return sources


def one_log_text(paths: Sequence[Path]) -> str:
    """One rank's files as one text file to download, each under a ``==> name <==`` line."""
    parts = []
    for path in paths:
        try:
            parts.append(f"==> {path.name} <==\n{path.read_bytes().decode(errors='replace')}")
        except OSError:
            continue
    return "\n".join(parts)


def logs_zip(attempts: Sequence[tuple[int, Path]]) -> bytes:
    """Every rank's log and the launcher's of each attempt (number, folder) as a zip:
    ``attempt-1/rank-0/stdout.log``, ``attempt-1/launcher.log``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for number, folder in attempts:
            for name, paths in log_sources(folder).items():
                for path in paths:
                    if path.is_file():
                        inside = path.name if name == LAUNCHER else f"{name.replace(' ', '-')}/{path.name}"
                        z.write(path, f"attempt-{number}/{inside}")
    return buffer.getvalue()


def _view(text: LogText, query: str, at_error: bool,
          levels: Sequence[str] = LEVELS) -> tuple[list[tuple[int | None, str]], int | None, str]:
    """What to show of one file: its lines of the chosen levels (the levels first, so that the end
    shown is the end of those lines, not the errors among the last 300 lines), the window of
    them to show, runyard's traceback frames folded; the error line's number, and a caption."""
    numbered, only = text.numbered(), ""
    if set(levels) != set(LEVELS):
        numbered = [line for line, level in zip(numbered, line_levels(text.lines), strict=True) if level in levels]
        only = f"; {', '.join(levels) or 'no'} lines only"
    shown, error_no, caption = _window(text, numbered, query, at_error)
    return fold_frames(shown), error_no, caption + only


def _window(text: LogText, numbered: list[tuple[int | None, str]], query: str,
            at_error: bool) -> tuple[list[tuple[int | None, str]], int | None, str]:
    """Which of ``numbered`` (lines of ``text``) to show: the lines, the error line's number, and a caption."""
    lines = [line for _, line in numbered]
    error = first_error(lines)
    error_no = numbered[error][0] if error is not None else None
    cut = f" (its last {MAX_READ_BYTES // 1024**2} MiB)" if text.cut else ""
    if query:
        hits = matching(lines, query)
        shown = [numbered[i] for i in hits[:MAX_MATCHES]]
        more = f", the first {MAX_MATCHES} shown" if len(hits) > MAX_MATCHES else ""
        return shown, error_no, f"{text.name}: {len(hits)} line(s) with “{query}”{cut}{more}"
    if at_error and error is not None:
        window = numbered[max(0, error - BEFORE_ERROR):error + AFTER_ERROR]
        where = f", line {error_no}" if error_no is not None else ""
        return window, error_no, f"{text.name}: from the first error{where}{cut}"
    if at_error:
        return numbered[-TAIL_LINES:], None, f"{text.name}: no error line{cut}; its end"
    return numbered[-TAIL_LINES:], error_no, f"{text.name}: its last {min(TAIL_LINES, len(numbered))} lines"


def _set(key: str, value: bool) -> None:
    st.session_state[key] = value


def log_panel(run_id: int, attempts: Sequence[dict[str, Any]], active: bool, opened: str | None = None) -> None:
    """The logs of the chosen attempt (the newest by default), one source at a time (``opened``
    first: the failing rank), with search, follow, first error and downloads."""
    folders = [(int(a["number"]), Path(a["dir"])) for a in attempts]
    c = st.columns([1.1, 1.2, 2.1, 2.2, 1.1, 1.6], vertical_alignment="bottom")
    numbers = [n for n, _ in folders][::-1]  # the newest first
    number = (c[0].selectbox("Attempt", numbers, key=f"log-attempt-{run_id}") if len(numbers) > 1 else None) \
        or numbers[0]
    folder = dict(folders)[number]
    sources = log_sources(folder)
    names = list(sources)
    source = c[1].selectbox("Log", names, index=names.index(opened) if opened in names else 0,
                            key=f"log-source-{run_id}") or names[0]
    query = c[2].text_input("Search this log", key=f"log-search-{run_id}", placeholder="text to find",
                            help="Every line that holds the text (any case), the matches highlighted")
    levels = c[3].pills("Levels", LEVELS, selection_mode="multi", default=list(LEVELS), key=f"log-levels-{run_id}",
                        help="The lines of these levels, as their text says (a traceback is an error)")
    follow = c[4].toggle("Follow", value=active, key=f"log-follow-{run_id}",
                         help="Keep reading the end of the log as the run writes it")
    error_key = f"log-at-error-{run_id}"
    at_error = bool(st.session_state.get(error_key)) and not query
    c[5].button("Back to the end" if at_error else "First error", key=f"log-error-button-{run_id}",
                icon=":material/vertical_align_bottom:" if at_error else ":material/error:",
                help="The end of the log" if at_error else "The log from its first traceback or exception line",
                on_click=_set, args=(error_key, not at_error))
    texts = [read_log(path, MAX_READ_BYTES if query or at_error else TAIL_BYTES) for path in sources[source]]
    frozen_key = f"log-frozen-{run_id}"
    if follow or query or at_error:
        st.session_state.pop(frozen_key, None)
    else:  # not following: the view stays as it was when Follow went off
        held = st.session_state.get(frozen_key)
        if held is not None and held[0] == (number, source):
            texts = held[1]
        else:
            st.session_state[frozen_key] = ((number, source), texts)
    for text in texts:
        shown, error_no, caption = _view(text, query, at_error, levels)
        st.caption(style.plain(caption))
        st.html(log_html(shown, query, error_no, follow=follow and not query and not at_error))
    downloads(run_id, number, source, sources[source], folders)


def _prepare(key: str, file_name: str, mime: str, build: Callable[[], bytes]) -> None:
    st.session_state[key] = (file_name, mime, build())


def downloads(run_id: int, number: int, source: str, paths: Sequence[Path],
              folders: Sequence[tuple[int, Path]]) -> None:
    """Two buttons that read the logs once (this log as one text file; every log of every
    attempt as a zip), then the download of what they read. Read on a click, not on every live
    refresh; and held as bytes: Streamlit's deferred downloads were lost to the page's refreshes."""
    key = f"log-prepared-{run_id}"
    name = f"run-{run_id}-attempt-{number}-{source.replace(' ', '-')}.log"
    row = st.container(horizontal=True, vertical_alignment="center")
    row.button(f"Download {source}", key=f"log-prepare-one-{run_id}", icon=":material/download:",
               on_click=_prepare, args=(key, name, "text/plain", lambda: one_log_text(paths).encode()))
    row.button("Download all logs (zip)", key=f"log-prepare-zip-{run_id}", icon=":material/folder_zip:",
               on_click=_prepare, args=(key, f"run-{run_id}-logs.zip", "application/zip", lambda: logs_zip(folders)))
    prepared = st.session_state.get(key)
    if prepared is not None:
        file_name, mime, payload = prepared
        row.download_button(f"Save {file_name} ({len(payload) / 1024:,.0f} KiB)", payload, file_name=file_name,
                            mime=mime, type="primary", icon=":material/save:", on_click="ignore",
                            key=f"log-save-{run_id}")
