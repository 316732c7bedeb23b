"""The ``attempt_energy`` rows: written by the scheduler's meter, read back for the summaries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Attempt, AttemptEnergy
from db.vocabulary.energy import Method, Tally, energy_of, run_energy


def _tally(row: AttemptEnergy) -> Tally:
    return Tally(row.device, Method(row.method), row.joules, row.counter, row.read_at, row.uncovered_s, row.note)


def load_tallies(session: Session, attempt_id: int) -> dict[str, Tally]:
    """The attempt's tallies by device (empty before its first reading)."""
    rows = session.scalars(select(AttemptEnergy).where(AttemptEnergy.attempt_id == attempt_id))
    return {row.device: _tally(row) for row in rows}


def save_tallies(session: Session, attempt_id: int, tallies: Iterable[Tally]) -> None:
    """Write the attempt's tallies (inserted or replaced; the caller commits)."""
    for t in tallies:
        row = session.get(AttemptEnergy, (attempt_id, t.device))
        if row is None:
            row = AttemptEnergy(attempt_id=attempt_id, device=t.device)
            session.add(row)
        row.method, row.joules, row.counter, row.read_at = t.method.value, t.joules, t.counter, t.read_at
        row.uncovered_s, row.note = t.uncovered_s, t.note


def attempt_energies(session: Session, run_ids: Sequence[int]) -> dict[tuple[int, int], dict[str, object]]:
    """Each attempt's energy (``{"kwh", "method", "source"}``) by (run id, attempt number), in one
    statement; an attempt with no reading is left out (:func:`energies` says why)."""
    if not run_ids:
        return {}
    rows = session.execute(
        select(Attempt.run_id, Attempt.number, AttemptEnergy)
        .join(AttemptEnergy, AttemptEnergy.attempt_id == Attempt.id).where(Attempt.run_id.in_(run_ids))
        .order_by(Attempt.run_id, Attempt.number, AttemptEnergy.device))
    tallies: dict[tuple[int, int], list[Tally]] = {}
    for run_id, number, row in rows:
        tallies.setdefault((run_id, number), []).append(_tally(row))
    return {key: energy_of(found) for key, found in tallies.items()}


def energies(session: Session, attempts: Mapping[int, Sequence[int]]
             ) -> tuple[dict[int, dict[str, object]], dict[tuple[int, int], dict[str, object]]]:
    """Each run's energy and each of its attempts', in one statement.

    Args:
        session: Where to read.
        attempts: Each run's attempt numbers, oldest first (none: the run has not started).

    Returns:
        (by run id, by (run id, attempt number)); an attempt with no reading (from before
        runyard read energy) is not measured, and says so.
    """
    found = attempt_energies(session, [run_id for run_id, numbers in attempts.items() if numbers])
    per_attempt = {(run_id, n): found.get((run_id, n)) or energy_of([]) for run_id, numbers in attempts.items()
                   for n in numbers}
    per_run = {run_id: run_energy([(n, per_attempt[(run_id, n)]) for n in numbers])
               for run_id, numbers in attempts.items()}
    return per_run, per_attempt

