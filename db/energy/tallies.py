"""The ``attempt_energy`` rows: written by the scheduler's meter, read back for the summaries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.metricstore.rollups import dialect_insert
from db.models import Attempt, AttemptEnergy
from db.vocabulary.energy import Energy, Method, Tally, energy_of, run_energy

# The columns of a tally, in Tally's order: read as plain rows, never as ORM objects (two threads of
# the scheduler write the same rows; an object a session holds would not see the other's write).
_COLUMNS = (AttemptEnergy.device, AttemptEnergy.method, AttemptEnergy.joules, AttemptEnergy.counter,
            AttemptEnergy.read_at, AttemptEnergy.uncovered_s, AttemptEnergy.note)


def _tally(row: Any) -> Tally:
    device, method, joules, counter, read_at, uncovered_s, note = row
    return Tally(device, Method(method), joules, counter, read_at, uncovered_s, note)


def load_tallies(session: Session, attempt_id: int) -> dict[str, Tally]:
    """The attempt's tallies by device (empty before its first reading)."""
    rows = session.execute(select(*_COLUMNS).where(AttemptEnergy.attempt_id == attempt_id))
    return {row.device: _tally(row) for row in rows}


def save_tallies(session: Session, attempt_id: int, tallies: Iterable[Tally]) -> None:
    """Write the attempt's tallies, each row whole (the caller commits).

    One upsert: the loop's reading at an attempt's end and the monitor's may meet, and each
    writes a tally consistent in itself (its joules and the reading they go up to), so the last
    one written is right whichever it is; the next reading goes on from it.
    """
    rows = [{"attempt_id": attempt_id, "device": t.device, "method": t.method.value, "joules": t.joules,
             "counter": t.counter, "read_at": t.read_at, "uncovered_s": t.uncovered_s, "note": t.note}
            for t in tallies]
    if not rows:
        return
    stmt = dialect_insert(session.get_bind().dialect.name)(AttemptEnergy).values(rows)
    keys = ("method", "joules", "counter", "read_at", "uncovered_s", "note")
    session.execute(stmt.on_conflict_do_update(index_elements=["attempt_id", "device"],
                                               set_={key: stmt.excluded[key] for key in keys}))


def attempt_energies(session: Session, run_ids: Sequence[int]) -> dict[tuple[int, int], Energy]:
    """Each attempt's energy (``{"kwh", "method", "source"}``) by (run id, attempt number), in one
    statement; an attempt with no reading is left out (:func:`energies` says why)."""
    if not run_ids:
        return {}
    rows = session.execute(
        select(Attempt.run_id, Attempt.number, *_COLUMNS)
        .join(AttemptEnergy, AttemptEnergy.attempt_id == Attempt.id).where(Attempt.run_id.in_(run_ids))
        .order_by(Attempt.run_id, Attempt.number, AttemptEnergy.device))
    tallies: dict[tuple[int, int], list[Tally]] = {}
    for run_id, number, *columns in rows:
        tallies.setdefault((run_id, number), []).append(_tally(columns))
    return {key: energy_of(found) for key, found in tallies.items()}


def energies(session: Session, attempts: Mapping[int, Sequence[int]]
             ) -> tuple[dict[int, Energy], dict[tuple[int, int], Energy]]:
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

