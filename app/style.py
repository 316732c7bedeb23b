"""How runyard's pages look: the few CSS rules it lays over Streamlit's own (each with the reason
it exists), plain-text escaping, and the run status badges.

Every page calls :func:`apply` first: a style-only ``st.html`` (no script, nothing fetched, no
element in the page's flow). Sent from app/main.py instead, before ``page.run()``, it never reached
the browser (Streamlit 1.67), and after it, it took the place of the page's toast."""

from __future__ import annotations

import pandas as pd
import streamlit as st

RULES = {
    # What a live panel drew stays as it is while the panel redraws: Streamlit fades it to 0.33
    # once a redraw takes over half a second, which on a loaded machine (or with many charts) was
    # most refreshes of the Run page (79% of samples). The panels redraw in place; this holds when
    # they are slow.
    "no stale fade": '[data-testid="stMain"] [data-stale="true"], '
                     '[data-testid="stMain"] [data-testid="stVerticalBlock"], '
                     '[data-testid="stMain"] [data-testid="stHorizontalBlock"], '
                     '[data-testid="stMain"] [data-testid="stExpander"] details'
                     " { opacity: 1 !important; transition: none !important; }",
    # The top bar's "N more" menu (the links that do not fit a narrow window) is measured a few
    # pixels short and clipped its own label ("1 mor"); the hidden links are moved out of the flow,
    # so letting the bar overflow shows nothing else.
    "top bar": '[data-testid="stTopNav"], [data-testid="stTopNavSection"] [data-testid="stMarkdownContainer"]'
               " { overflow: visible; }",
    # A checkbox's or toggle's label is cut with an ellipsis where its column is narrow ("Write in
    # the backgr…" at 800 px); text inputs' labels wrap, so these wrap too, and so do the Run
    # page's headline tiles' labels (eight tiles in one row: "Cloud r…" at 800 px).
    "wrapping labels": '[data-testid="stCheckbox"] [data-testid="stWidgetLabel"] *, '
                       '[data-testid="stMetricLabel"] [data-testid="stMarkdownContainer"],'
                       ' [data-testid="stMetricLabel"] [data-testid="stMarkdownContainer"] p'
                       " { white-space: normal; overflow: visible; text-overflow: clip; }",
    # The headline numbers (st.metric) are cut to "$…" in a sixth of an 800-px window at their
    # fixed 2.25rem: they scale with the window instead, from 1.25rem up to that size.
    "headline numbers": '[data-testid="stMetricValue"] { font-size: clamp(1.25rem, 2.4vw, 2.25rem); }',
    # Vega's tooltip is one element of the page that a chart redrawn under the pointer (every live
    # refresh) never hides again: it stayed over the page, stuck. It shows only while a chart is hovered.
    "tooltip": 'body:not(:has([data-testid="stVegaLiteChart"]:hover)) #vg-tooltip-element'
               " { visibility: hidden !important; }",
    # A rank's log (app/log_view.py): a box that scrolls (lines are not wrapped: a traceback reads as
    # written), kept at its end while it follows the log (a reversed flex column starts scrolled to
    # its end, no script needed); colours that read on the light and the dark theme alike.
    # The Run page's first screen holds its first chart whole (issue 56): Streamlit's top padding
    # under the navigation bar (8rem) left a blank band as tall as a row of the header.
    "run page top": '[data-testid="stMainBlockContainer"]:has(.st-key-headline) { padding-top: 5rem; }',
    # A failed run's one line (app/run_panels.py's failure_summary): a closed section's label, in
    # the red of an error (the same on both themes), its traceback folded under it.
    "failure line": ".st-key-failure summary { color: rgb(214, 39, 40); }",
    "log box": ".runyard-log { max-height: 30rem; overflow: auto; border: 1px solid rgba(128, 128, 128, 0.35);"
               " border-radius: 0.5rem; background: rgba(128, 128, 128, 0.07); }"
               " .runyard-log-follow { display: flex; flex-direction: column-reverse; }"
               " .runyard-log pre { margin: 0; padding: 0.5rem 0.75rem; font-size: 0.8rem; line-height: 1.45;"
               " white-space: pre; background: transparent; color: inherit; }"
               " .runyard-log-no { display: inline-block; min-width: 3.5em; margin-right: 1em; text-align: right;"
               " opacity: 0.55; user-select: none; }"
               " .runyard-log-error { background: rgba(214, 39, 40, 0.22); }"
               " .runyard-log mark { background: #ffd54f; color: #111111; border-radius: 2px; }",
}


def page_css() -> str:
    """The ``<style>`` block for every page."""
    return "<style>\n" + "\n".join(RULES.values()) + "\n</style>"


def apply() -> None:
    """Send the rules with this page run."""
    st.html(page_css())


# Characters Markdown, Streamlit's directives (`:red[..]`), LaTeX (`$..$`) or HTML give a meaning.
_MARKUP_SPECIALS = frozenset("\\`*_{}[]()<>#!|$~:&")


def plain(text: object) -> str:
    """``text`` that a run controls (a name, an exception, a log line), escaped so that
    ``st.markdown``/``st.caption``/``st.info`` show it as written: no image is fetched, nothing
    turns bold, into LaTeX or into HTML. The one owner of this escaping; newlines stay."""
    out = []
    for char in str(text):
        if char == "<":
            out.append("&lt;")
        elif char == ">":
            out.append("&gt;")
        elif char == "&":
            out.append("&amp;")
        elif char in _MARKUP_SPECIALS:
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def plain_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` for ``st.table``, which reads its cells, column names and index as Markdown: every
    text in it passed through :func:`plain` (numbers and other values stay as they are)."""
    def text(value: object) -> object:
        return plain(value) if isinstance(value, str) else value

    out = frame.map(text)
    out.columns = pd.Index([text(c) for c in frame.columns], name=frame.columns.name)
    if not isinstance(frame.index, pd.RangeIndex):  # Streamlit hides a RangeIndex, and only that
        out.index = pd.Index([text(i) for i in frame.index], name=frame.index.name)
    return out


# A run status as a Streamlit badge: its colour and icon.
STATUS_BADGE = {
    "QUEUED": ("gray", ":material/schedule:"),
    "STARTING": ("blue", ":material/rocket_launch:"),
    "RUNNING": ("blue", ":material/play_arrow:"),
    "RETRYING": ("orange", ":material/refresh:"),
    "CANCELLING": ("orange", ":material/stop_circle:"),
    "PAUSING": ("violet", ":material/pause:"),
    "SUCCEEDED": ("green", ":material/check_circle:"),
    "FAILED": ("red", ":material/error:"),
    "CANCELLED": ("gray", ":material/cancel:"),
    "PAUSED": ("violet", ":material/pause_circle:"),
    "PRUNED": ("violet", ":material/content_cut:"),  # a sweep's trial stopped early: resumable, like PAUSED
}


# A status cell of a table (the Runs and Sweeps lists) as a badge, in the badges' colours: (background, text).
BADGE_CSS = {"gray": ("#e8eaed", "#3c4043"), "blue": ("#d2e3fc", "#174ea6"), "orange": ("#feefc3", "#b06000"),
             "green": ("#ceead6", "#0d652d"), "red": ("#fad2cf", "#a50e0e"), "violet": ("#e9d7fe", "#5b2c99")}


# The same on the dark theme: the light pastels glared there, with text too dark to read on the
# grid's dark cells; these are Streamlit's own dark badge colours (a translucent fill, light text).
DARK_BADGE_CSS = {"gray": ("rgba(172, 177, 195, 0.25)", "#d5dae5"), "blue": ("rgba(61, 157, 243, 0.25)", "#a6d4ff"),
                  "orange": ("rgba(255, 164, 33, 0.25)", "#ffd16a"), "green": ("rgba(33, 195, 84, 0.25)", "#7defa1"),
                  "red": ("rgba(255, 75, 75, 0.25)", "#ffabab"), "violet": ("rgba(128, 61, 245, 0.3)", "#dbbbff")}


def dark_theme() -> bool:
    """Whether the browser shows the dark theme (as it told Streamlit; light when not known)."""
    try:
        return st.context.theme.type == "dark"
    except (AttributeError, RuntimeError):  # no browser session: a bare script, a unit test's call
        return False


def status_css(status: str, badges: dict[str, tuple[str, str]] | None = None, dark: bool | None = None) -> str:
    """The CSS of a table's status cell (``Styler.map``): the status's badge colours in ``badges``
    (the run statuses' when None), for the theme the browser shows unless ``dark`` says."""
    palette = DARK_BADGE_CSS if (dark_theme() if dark is None else dark) else BADGE_CSS
    background, text = palette[(badges or STATUS_BADGE).get(status, ("gray", ""))[0]]
    return f"background-color: {background}; color: {text}"


def badge(status: str, words: str | None = None) -> str:
    """``status`` as Streamlit badge markup (``:color-badge[icon STATUS]``), saying ``words`` when
    given (a trial stopped early: ``stopped early at step 40 by sweep 3``)."""
    color, icon = STATUS_BADGE.get(status, ("gray", ""))
    return f":{color}-badge[{icon} {words or status}]"


# A sweep's status (db/sweeps/states.py) as a badge: its colour and icon.
SWEEP_BADGE = {
    "RUNNING": ("blue", ":material/play_arrow:"),
    "PAUSED": ("violet", ":material/pause_circle:"),
    "FINISHED": ("green", ":material/check_circle:"),
    "STOPPED": ("orange", ":material/block:"),  # the budget or the breaker ended it
    "CANCELLED": ("gray", ":material/cancel:"),
}


def sweep_badge(status: str) -> str:
    """A sweep's ``status`` as Streamlit badge markup."""
    color, icon = SWEEP_BADGE.get(status, ("gray", ""))
    return f":{color}-badge[{icon} {status}]"
