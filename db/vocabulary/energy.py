"""Energy: the arithmetic of one device's readings, and the words a run's energy is given in.

The scheduler reads each device an attempt holds at its start, at every system-metrics tick and
at its end (orchestrator/scheduler/energy.py) and keeps, per attempt and device, the joules so
far, the method and the last raw reading (db/energy/). :func:`advance` is one step of that
bookkeeping, a pure function: a cumulative counter (NVML's, RAPL's) adds what it moved, through a
driver reload (the counter restarts at 0) or a wrap (RAPL's ``max_energy_range_uj``); a power
reading adds power x time between two readings close enough together, and says which seconds it
could not cover. :func:`energy_of` gives the agreed dict (``kwh``, ``method``, ``source``) of an
attempt or a run. docs/COSTS.md ("Energy") says how far each method is to be trusted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import TypedDict

JOULES_PER_KWH = 3.6e6
# Two power readings further apart than this are not bridged by power x time: the seconds
# between them are said to be uncovered (a scheduler restart, a stalled monitor). The monitor
# reads every 2 s.
BRIDGE_S = 10.0
# A RAPL package draws at most about this much: two readings further apart than its counter's range
# takes at this power may have seen it wrap more than once, so the time between them is said to be
# not covered rather than counted as one wrap (a package's range is about 262 kJ: 520 s at 500 W).
RAPL_MAX_W = 500.0


class Method(str, Enum):
    """How a figure was obtained, strongest first (a run mixing them reports the weakest)."""

    MEASURED = "measured"
    ESTIMATED = "estimated"
    NOT_MEASURED = "not measured"


def weakest(methods: Iterable[Method | str]) -> Method:
    """The weakest of ``methods`` (measured < estimated < not measured); not measured when none."""
    order = list(Method)
    found = [Method(m) for m in methods]
    return max(found, key=order.index) if found else Method.NOT_MEASURED


class Energy(TypedDict):
    """An attempt's or a run's energy, as the run summary, ``runyard show --json`` and the pages give it."""

    kwh: float | None  # None: nothing was measured or estimated
    method: str  # a Method's value
    source: str  # in words: what was read, or why not


@dataclass(frozen=True)
class Reading:
    """One device read once.

    Attributes:
        device: ``gpu<N>`` (NVML's index), ``rapl:<N>`` (a CPU package), or ``none``.
        method: measured (a cumulative counter), estimated (a power reading), not measured.
        value: the counter in joules (measured) or the power in watts (estimated); None when not measured.
        wrap: the counter's range in joules where it wraps (RAPL); None where it does not.
        share: the part of the device the attempt holds (RAPL: its CPU slots over the machine's).
        note: words for the source: the share ("2 of 4 CPU slots"), or why it is not measured.
    """

    device: str
    method: Method
    value: float | None = None
    wrap: float | None = None
    share: float = 1.0
    note: str = ""


@dataclass(frozen=True)
class Tally:
    """What is kept per attempt and device between readings (the row of ``attempt_energy``)."""

    device: str
    method: Method
    joules: float
    counter: float | None  # the last reading's value: a counter in joules, or a power in watts
    read_at: float
    uncovered_s: float = 0.0  # seconds no reading covered: power x time's gaps, or before the first reading
    note: str = ""


def advance(tally: Tally | None, reading: Reading, now: float, started_at: float | None = None) -> Tally:
    """``tally`` moved on by ``reading`` taken at ``now``.

    Args:
        tally: what was kept so far; None for the device's first reading.
        reading: the device read now.
        now: when it was read (epoch seconds).
        started_at: the attempt's start: a first reading well after it (an attempt from before
            energy was read, adopted) says the seconds it missed; a cumulative counter's first
            reading is its baseline either way.

    Returns:
        The new tally. A counter that went down counts its new value (a driver reload restarts it
        at 0), or the range added to it where it wraps; a power reading adds the mean of the two
        readings times the seconds between them when they are at most ``BRIDGE_S`` apart.
    """
    if tally is None:
        missed = now - started_at if started_at is not None and now - started_at > BRIDGE_S else 0.0
        return Tally(reading.device, reading.method, 0.0, reading.value, now, missed, reading.note)
    if reading.value is None:
        return tally  # a reading that failed this once: the next one covers the time (a counter) or says so
    if tally.counter is None or tally.method is not reading.method:
        # Read for the first time, or another way than before: a new baseline; the seconds since the
        # last reading are not covered.
        return Tally(reading.device, reading.method, tally.joules, reading.value, now,
                     tally.uncovered_s + now - tally.read_at, reading.note)
    if reading.method is Method.MEASURED:
        gap = now - tally.read_at
        if reading.wrap and gap > reading.wrap / RAPL_MAX_W:
            return replace(tally, counter=reading.value, read_at=now, uncovered_s=tally.uncovered_s + gap,
                           note=reading.note)
        moved = reading.value - tally.counter
        if moved < 0:
            moved = moved + reading.wrap if reading.wrap else reading.value
        return replace(tally, joules=tally.joules + moved * reading.share, counter=reading.value, read_at=now,
                       note=reading.note)
    gap = now - tally.read_at
    if gap > BRIDGE_S:
        return replace(tally, counter=reading.value, read_at=now, uncovered_s=tally.uncovered_s + gap)
    joules = (tally.counter + reading.value) / 2.0 * max(gap, 0.0) * reading.share
    return replace(tally, joules=tally.joules + joules, counter=reading.value, read_at=now, note=reading.note)


# -- the words ------------------------------------------------------------------------------------


def unread_until(tally: Tally, now: float) -> Tally:
    """``tally`` carried to ``now`` without a reading: the seconds since its last one are not covered
    (an attempt that ended while no scheduler read it: what its devices did since is not its own)."""
    return replace(tally, read_at=now, uncovered_s=tally.uncovered_s + max(0.0, now - tally.read_at))


def _listed(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _gpus(devices: Sequence[str]) -> str:
    numbers = sorted(int(d[3:]) for d in devices)
    return ("GPU " if len(numbers) == 1 else "GPUs ") + _listed([str(n) for n in numbers])


def source_of(tallies: Sequence[Tally]) -> str:
    """An attempt's source in words: "NVML energy counter, GPUs 0 and 1", "NVML power x time,
    GPU 0", "RAPL package energy, 2 of 2 CPU slots", or why it is not measured."""
    if not tallies:
        return "not read (the attempt ran before runyard read energy)"
    parts = []
    counters = [t.device for t in tallies if t.method is Method.MEASURED and t.device.startswith("gpu")]
    powers = [t.device for t in tallies if t.method is Method.ESTIMATED]
    packages = [t for t in tallies if t.method is Method.MEASURED and t.device.startswith("rapl")]
    if counters:
        parts.append(f"NVML energy counter, {_gpus(counters)}")
    if powers:
        parts.append(f"NVML power x time, {_gpus(powers)}")
    if packages:
        parts.append(f"RAPL package energy, {packages[0].note}" if packages[0].note else "RAPL package energy")
    parts += sorted({t.note for t in tallies if t.method is Method.NOT_MEASURED and t.note})
    uncovered = max((t.uncovered_s for t in tallies), default=0.0)
    text = "; ".join(parts) or "not measured"
    return f"{text} ({uncovered:.0f} s not covered: no reading spanned them)" if uncovered >= 1 else text


def energy_of(tallies: Sequence[Tally]) -> Energy:
    """One attempt's energy: ``{"kwh", "method", "source"}`` (kwh None when nothing was measured)."""
    method = weakest(t.method for t in tallies)
    counted = [t.joules for t in tallies if t.method is not Method.NOT_MEASURED]
    kwh = sum(counted) / JOULES_PER_KWH if counted else None
    return {"kwh": kwh, "method": method.value, "source": source_of(tallies)}


def run_energy(attempts: Sequence[tuple[int, Energy]]) -> Energy:
    """A run's energy from its attempts' (number, energy) pairs, oldest first: the kWh summed,
    the weakest method, and a source that names the attempts when they differ."""
    if not attempts:
        return {"kwh": None, "method": Method.NOT_MEASURED.value, "source": "not started"}
    counted = [e["kwh"] for _, e in attempts if e["kwh"] is not None]
    by_source: dict[str, list[int]] = {}
    for number, e in attempts:
        by_source.setdefault(e["source"], []).append(number)
    if len(by_source) == 1:
        source = next(iter(by_source))
    else:
        source = "; ".join(f"{'attempt' if len(n) == 1 else 'attempts'} {_listed([str(i) for i in n])}: {s}"
                           for s, n in by_source.items())
    return {"kwh": sum(counted) if counted else None, "method": weakest(e["method"] for _, e in attempts).value,
            "source": source}
