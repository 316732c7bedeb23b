"""What the Runs page's analysis tools and the charts agree on about plain values: which values
are numbers (:func:`is_number`), a config value as text (:func:`value_text`: a group's label, a
choice on a parallel-coordinates axis), and when numbers are drawn on a log scale
(:func:`spans_decades`: a metric's chart, Compare's, a parallel-coordinates axis)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypeGuard

LOG_FROM_DECADES = 2.0  # values that span more than this many decades are drawn on a log axis


def is_number(value: Any) -> TypeGuard[int | float]:
    """Whether ``value`` is a finite number (a bool is not one, nor None, nor nan)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def value_text(value: Any) -> str:
    """A config value as a person reads it, exactly (``0.001``, ``1e-07``, ``true``, ``[1, 2]``):
    two values that differ never read the same."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return str(value)  # a float's shortest text that reads back as the same float


def spans_decades(values: Iterable[Any], decades: float = LOG_FROM_DECADES) -> bool:
    """Whether the positive finite numbers among ``values`` span more than ``decades`` powers of
    ten: a loss from 10 to 0.01 is a flat line after its first steps on a linear axis."""
    positive = [float(v) for v in values if is_number(v) and v > 0]
    return len(positive) > 1 and math.log10(max(positive) / min(positive)) > decades
