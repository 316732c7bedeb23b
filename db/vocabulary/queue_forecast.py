"""When each queued run will start: the scheduler's admission walked forward in time.

Pure arithmetic over plain values, no database: the runs that hold this machine's devices with
the time each is predicted to end, the queued runs in admission order with the devices each needs
and how long it should take, and the machine's capacity. Admission (orchestrator/scheduler/
admission.py) starts queued runs first come first served and never lets a later run overtake an
earlier one, so a queued run starts at the first moment, no earlier than the run before it, when
enough devices are free; it then holds them for its own predicted length.

A run whose end cannot be predicted (no pace yet, no total of steps, no alike earlier run) is
never guessed at: a queued run that needs its devices is "after run N, whose length is not known",
and so is every run behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

# A run that outlived its predicted end, and whose band's high end is behind it too, is expected
# to need this share of the time it has run so far again (at least OVERRUN_MIN_S): it is later
# than predicted, and a run that overran once tends to overrun by a part of its own length.
OVERRUN_SHARE = 0.1
OVERRUN_MIN_S = 60.0


@dataclass(frozen=True)
class Holder:
    """A run that holds devices now.

    Attributes:
        run_id: The run.
        devices: How many devices (GPUs, or CPU slots) it holds.
        ends_at: When it is predicted to end (epoch seconds), None when its length is not known.
        ends_at_high: The slow end of its prediction's band, if it has one.
        started_at: When its current attempt started (for the overrun correction).
    """

    run_id: int
    devices: int
    ends_at: float | None
    ends_at_high: float | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class Waiting:
    """A queued run, in admission order.

    Attributes:
        run_id: The run.
        devices: How many devices it needs.
        duration_s: How long it should take once started (None: not known).
    """

    run_id: int
    devices: int
    duration_s: float | None


@dataclass(frozen=True)
class Start:
    """When a queued run starts, and why then.

    Attributes:
        at: The predicted start (epoch seconds); None when it cannot be said.
        after_run: The run whose end frees the devices it waits for (None: free now, or never).
        basis: What the estimate rests on, in words.
        ends_at: When it is then predicted to end (None when not known).
        here: Whether it waits for this machine (False: a Slurm run, which Slurm places).
    """

    at: float | None
    after_run: int | None
    basis: str
    ends_at: float | None = None
    here: bool = True

    def as_dict(self) -> dict[str, float | int | str | None]:
        """The run summary's ``start_estimate``: ``{"at", "after_run", "basis"}``."""
        return {"at": self.at, "after_run": self.after_run, "basis": self.basis}


def corrected_end(holder: Holder, now: float) -> float | None:
    """When ``holder`` should end, never in the past: a run that outlived its prediction ends at
    its band's slow end if that is still ahead, else at ``now`` plus :data:`OVERRUN_SHARE` of the
    time it has run (at least :data:`OVERRUN_MIN_S`)."""
    if holder.ends_at is None or holder.ends_at > now:
        return holder.ends_at
    if holder.ends_at_high is not None and holder.ends_at_high > now:
        return holder.ends_at_high
    ran = now - holder.started_at if holder.started_at is not None else 0.0
    return now + max(OVERRUN_MIN_S, OVERRUN_SHARE * ran)


@dataclass
class _Slot:
    """Devices held until ``ends_at`` (None: an unknown time) by ``run_id``."""

    run_id: int
    devices: int
    ends_at: float | None


def forecast(holders: list[Holder], waiting: list[Waiting], capacity: int, now: float) -> dict[int, Start]:
    """Each waiting run's start, walking the queue the way admission does.

    Args:
        holders: The runs that hold devices now, with their predicted ends.
        waiting: The queued runs, in admission order (oldest first).
        capacity: The machine's devices (GPUs, or CPU slots).
        now: The time of the forecast.

    Returns:
        A :class:`Start` by run id, for every waiting run.
    """
    slots = [_Slot(h.run_id, h.devices, corrected_end(h, now)) for h in holders]
    overran = {h.run_id for h in holders if h.ends_at is not None and h.ends_at <= now}
    earliest, after, unknown = now, None, None  # no overtaking: none starts before the one ahead
    starts: dict[int, Start] = {}
    never: Start | None = None
    for run in waiting:
        if never is not None:
            starts[run.run_id] = never
            continue
        if run.devices > capacity:
            # Admission lets nothing overtake it: the runs behind it wait until it is cancelled.
            starts[run.run_id] = Start(None, None, f"never here: it needs {run.devices} devices and this machine "
                                                   f"has {capacity}; cancel it and submit it with fewer ranks")
            never = Start(None, run.run_id, f"behind run {run.run_id}, which can never start here "
                                            f"(it needs {run.devices} devices of {capacity}): cancel it")
            continue
        if unknown is not None:
            starts[run.run_id] = _unknown(unknown)
            continue
        at, freed_by = _first_fit(slots, run.devices, capacity, earliest)
        if at is None:
            unknown = freed_by
            starts[run.run_id] = _unknown(unknown)
            continue
        if at > earliest or after is None:
            after = freed_by
        earliest = at
        ends = at + run.duration_s if run.duration_s is not None else None
        slots.append(_Slot(run.run_id, run.devices, ends))
        starts[run.run_id] = Start(at, after, _basis(after, at, now, after in overran), ends)
    return starts


def _first_fit(slots: list[_Slot], need: int, capacity: int, earliest: float) -> tuple[float | None, int | None]:
    """The first time from ``earliest`` at which ``need`` devices are free, and the run whose end
    frees them (None when they are free already). (None, run) when that run's end is not known."""
    held = [s for s in slots if s.ends_at is None or s.ends_at > earliest]
    free = capacity - sum(s.devices for s in held)
    if free >= need:
        return earliest, None
    for slot in sorted(held, key=lambda s: (s.ends_at is None, s.ends_at or 0.0, s.run_id)):
        if slot.ends_at is None:
            return None, slot.run_id
        free += slot.devices
        if free >= need:
            return slot.ends_at, slot.run_id
    return None, None  # not reached: need <= capacity


def _unknown(run_id: int | None) -> Start:
    return Start(None, run_id, f"after run {run_id}, whose length is not known")


def _basis(after: int | None, at: float, now: float, overran: bool) -> str:
    if after is None:
        return "its devices are free: the scheduler starts it at its next look" if at <= now else (
            "when the runs ahead of it start")
    if overran:
        return f"after run {after}, which has outlived its predicted end (its end is pushed later)"
    return f"after run {after} ends, by that run's predicted end"


def queue_end(starts: dict[int, Start]) -> tuple[float | None, int | None]:
    """When the runs queued for this machine should all be done: (the latest predicted end, None),
    or (None, the run whose start or length keeps it from being known); (None, None) when none is
    queued here."""
    ends = []
    for run_id, start in sorted(starts.items()):
        if not start.here:
            continue
        if start.ends_at is None:
            return None, start.after_run if start.at is None and start.after_run is not None else run_id
        ends.append(start.ends_at)
    return (max(ends), None) if ends else (None, None)
