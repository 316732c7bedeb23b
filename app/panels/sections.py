"""Which charts the Metrics section shows, where, and which it draws: plain names in, plain
answers out (no Streamlit, no database), as TensorBoard's scalar tab and W&B's workspace group them.

A metric's section is its name's prefix before the first ``/`` (``train/loss`` is in ``train``);
names without one are in the first section, "Charts" (:data:`UNPREFIXED`). Sections holding the
loss or the workload's headline metric come first, the unprefixed one before the others, then
every other section alphabetically. A section draws its first :data:`FIRST_CHARTS` charts until
the person asks for all of them, a closed one draws nothing, and when a run has more than
:data:`MANY_CHARTS` metrics only its first :data:`OPEN_WHEN_MANY` sections start open: a run with
200 metric names draws a dozen charts, not 200 (MLflow #24012)."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from db.vocabulary import metric_registry

UNPREFIXED = "/"  # the section of names without a prefix: no prefix can be "/" (it ends at the first one)
UNPREFIXED_LABEL = "Charts"
# The Run page's charts first, in this order, in whichever section holds them.
CHART_ORDER = ("loss", "eval_accuracy", "eval_loss", "samples_per_s", "step_time")
HIDDEN = frozenset({"epoch"})  # a counter, not a curve: never charted
FIRST_CHARTS = 8  # charts a section draws until "Show all"
MANY_CHARTS, OPEN_WHEN_MANY = 24, 2  # past this many metrics, only the first sections start open


@dataclass(frozen=True)
class Section:
    """One section of the Metrics section: its id (the prefix, or :data:`UNPREFIXED`) and its
    metric names in the order they are drawn."""

    id: str
    keys: tuple[str, ...]

    @property
    def label(self) -> str:
        """The section's title with its chart count: "train · 12 charts"."""
        name = UNPREFIXED_LABEL if self.id == UNPREFIXED else self.id
        return f"{name} · {len(self.keys)} chart{'s' if len(self.keys) != 1 else ''}"


def section_of(key: str) -> str:
    """The section of a metric name: its prefix before the first ``/``, else :data:`UNPREFIXED`."""
    prefix, slash, _rest = key.partition("/")
    return prefix if slash and prefix else UNPREFIXED


def _natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that puts ``layer2`` before ``layer10``."""
    return tuple((0, int(part)) if part.isdigit() else (1, part.lower()) for part in re.split(r"(\d+)", text) if part)


def _headline(keys: Collection[str]) -> bool:
    """Whether a section holds the loss or a headline metric (under any prefix: ``val/loss``)."""
    names = {k.rsplit("/", 1)[-1] for k in keys}
    return bool(names & {*metric_registry.LOSS_KEYS, *metric_registry.HEADLINE_KEYS, "loss"})


def chart_order(keys: Iterable[str]) -> list[str]:
    """Metric names in drawing order: :data:`CHART_ORDER`'s first, then naturally sorted."""
    rank = {k: i for i, k in enumerate(CHART_ORDER)}
    return sorted(keys, key=lambda k: (rank.get(k, len(rank)), _natural(k)))


def sections(keys: Iterable[str]) -> list[Section]:
    """The run's metric names grouped into sections, in the order the page shows them."""
    grouped: dict[str, list[str]] = {}
    for key in keys:
        if key not in HIDDEN:
            grouped.setdefault(section_of(key), []).append(key)
    ordered = sorted(grouped, key=lambda s: (not _headline(grouped[s]), s != UNPREFIXED, _natural(s)))
    return [Section(s, tuple(chart_order(grouped[s]))) for s in ordered]


def opened(found: Sequence[Section], chosen: Mapping[str, bool]) -> dict[str, bool]:
    """Section id -> whether it is open: as the person left it, else open, except past the first
    :data:`OPEN_WHEN_MANY` sections of a run with more than :data:`MANY_CHARTS` charts."""
    many = sum(len(s.keys) for s in found) > MANY_CHARTS
    return {s.id: chosen.get(s.id, not many or i < OPEN_WHEN_MANY) for i, s in enumerate(found)}


def drawn(section: Section, is_open: bool, full: str | None, show_all: bool) -> tuple[str, ...]:
    """The charts a section draws: none while closed; the chart open full width alone when it is
    one of the section's; else its first :data:`FIRST_CHARTS` (every one after "Show all")."""
    if not is_open:
        return ()
    if full in section.keys:
        return (full,)
    return section.keys if show_all else section.keys[:FIRST_CHARTS]


def drawn_keys(found: Sequence[Section], open_now: Mapping[str, bool], full: str | None,
               shown_all: Collection[str]) -> list[str]:
    """Every chart drawn on the Metrics section: the metrics whose series are fetched."""
    return [k for s in found for k in drawn(s, open_now.get(s.id, False), full, s.id in shown_all)]


def overview_keys(keys: Sequence[str], pinned: Sequence[str] | None) -> list[str]:
    """The curves on the Overview: the pinned ones this run has (in the run's order); none when
    the person unpinned every curve (``pinned`` empty); else, until they pin (``None``) or on a
    run that has none of their pins, the loss and the headline metric (a script's first two
    metrics when it names neither)."""
    shown = [k for k in keys if k not in HIDDEN]
    if pinned is not None:
        chosen = [k for k in shown if k in set(pinned)]
        if chosen or not pinned or not shown:
            return chosen
    loss = metric_registry.loss_key(shown)
    headline = metric_registry.headline_key(shown)
    picked = [k for k in (loss, headline) if k is not None]
    return picked or shown[:2]
