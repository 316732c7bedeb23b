"""The energy each attempt used, as stored: the scheduler's tallies written and read back
(``attempt_energy``, db/models.py), and each run's and attempt's energy in the agreed dict
(``{"kwh", "method", "source"}``) for many runs in one statement. The arithmetic and the words are
db/vocabulary/energy.py's; the readings are taken by orchestrator/scheduler/energy.py.
"""

from __future__ import annotations

from db.energy.tallies import attempt_energies, energies, load_tallies, save_tallies

__all__ = ["attempt_energies", "energies", "load_tallies", "save_tallies"]
