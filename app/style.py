"""The few CSS rules runyard lays over Streamlit's own, each with the reason it exists.

Injected once per page run by app/main.py as a ``<style>`` block in Markdown (no script, nothing
fetched; Streamlit 1.67 did not apply a style-only ``st.html`` under top navigation)."""

from __future__ import annotations

RULES = {
    # The top bar's "N more" menu (the links that do not fit a narrow window) is measured a few
    # pixels short and clipped its own label ("1 mor"); the hidden links are moved out of the flow,
    # so letting the bar overflow shows nothing else.
    "top bar": '[data-testid="stTopNav"], [data-testid="stTopNavSection"] [data-testid="stMarkdownContainer"]'
               " { overflow: visible; }",
    # A checkbox's or toggle's label is cut with an ellipsis where its column is narrow ("Write in
    # the backgr…" at 800 px); text inputs' labels wrap, so these wrap too.
    "wrapping labels": 'label[data-baseweb="checkbox"] [data-testid="stMarkdownContainer"]'
                       " { white-space: normal; overflow: visible; text-overflow: clip; }",
}


def page_css() -> str:
    """The ``<style>`` block for every page."""
    return "<style>\n" + "\n".join(RULES.values()) + "\n</style>"
