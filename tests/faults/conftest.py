"""The fault suite: each case a hostile tester found, reproduced with real torchrun ranks, and
what must hold instead. Fixtures shared with the integration tests (a real runyard install in
tmp_path, its CLI and scheduler as subprocesses), plus the attempt watcher.

The watcher
-----------
:class:`AttemptWatcher` samples the machine's processes in a thread (every 50 ms by default)
and records, for every run under a data folder, which attempts had ranks alive at each sample.
A rank is a process whose environment carries the run's ``RUNYARD_RUN_DIR`` (under the
watcher's ``home``) and ``LOCAL_RANK`` (torchrun sets it for the processes it starts); its
attempt is its ``RUNYARD_ATTEMPT``. The rule it checks: **at no sample are ranks of two
attempts of one run alive together**. Use it through the ``watcher`` fixture (it needs the
``product`` fixture), which fails the test at teardown if the rule was ever broken::

    def test_something(product, watcher):
        run_id = product.submit(...)
        product.start_scheduler()
        ...
        watcher.assert_never_together()            # also checked at teardown
        assert watcher.attempts_seen(run_dir) == {1, 2}

or standalone: ``with AttemptWatcher(home) as w: ...``. Zombies do not count (they hold
nothing); a process that cannot be read is skipped. The watcher runs beside the tests on a
loaded machine, so a sample can come late: it is evidence of what it saw, and ``samples`` says
how often it looked (``max_gap_s``).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import Product, product, running_product  # noqa: F401


@dataclass(frozen=True)
class Sample:
    """One look at the machine: for each run directory, the pids of each attempt's live ranks."""

    at: float
    ranks: dict[str, dict[int, frozenset[int]]]


@dataclass(frozen=True)
class Overlap:
    """A sample at which ranks of more than one attempt of a run were alive."""

    at: float
    run_dir: str
    attempts: dict[int, frozenset[int]]  # attempt -> pids of its live ranks

    def __str__(self) -> str:
        who = ", ".join(f"attempt {a}: pids {sorted(p)}" for a, p in sorted(self.attempts.items()))
        return f"{time.strftime('%H:%M:%S', time.localtime(self.at))} {self.run_dir}: {who}"


@dataclass
class AttemptWatcher:
    """Samples live ranks of every run under ``home`` in a background thread (see the module
    docstring). ``interval_s`` is the pause between two samples."""

    home: Path
    interval_s: float = 0.05
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    # -- running ----------------------------------------------------------------------------

    def start(self) -> AttemptWatcher:
        self._thread = threading.Thread(target=self._loop, name="attempt-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> AttemptWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self.interval_s)

    def sample(self) -> Sample:
        """Look once (also callable directly, without the thread)."""
        prefix = str(self.home) + os.sep
        ranks: dict[str, dict[int, set[int]]] = {}
        for proc in psutil.process_iter(["pid"]):
            try:
                env = proc.environ()
                run_dir = env.get("RUNYARD_RUN_DIR", "")
                if not run_dir.startswith(prefix) or "LOCAL_RANK" not in env:
                    continue
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                attempt = int(env.get("RUNYARD_ATTEMPT", "0"))
            except (psutil.Error, OSError, ValueError):
                continue
            ranks.setdefault(run_dir, {}).setdefault(attempt, set()).add(proc.pid)
        return Sample(time.time(), {d: {a: frozenset(p) for a, p in by.items()} for d, by in ranks.items()})

    # -- reading ----------------------------------------------------------------------------

    def overlaps(self) -> list[Overlap]:
        """Every sample at which two or more attempts of one run had live ranks."""
        return [Overlap(s.at, run_dir, by_attempt) for s in list(self.samples)
                for run_dir, by_attempt in s.ranks.items() if len(by_attempt) > 1]

    def assert_never_together(self) -> None:
        """Fail, naming the first few moments and pids, if two attempts' ranks ever lived together."""
        found = self.overlaps()
        assert not found, (f"ranks of two attempts of one run were alive together at {len(found)} of "
                           f"{len(self.samples)} samples, first: " + "; ".join(map(str, found[:3])))

    def attempts_seen(self, run_dir: str | Path) -> set[int]:
        """The attempts of ``run_dir`` whose ranks were seen alive at least once."""
        return {a for s in list(self.samples) for a in s.ranks.get(str(run_dir), {})}

    def ranks_alive(self, run_dir: str | Path) -> dict[int, frozenset[int]]:
        """At the newest sample: each attempt of ``run_dir`` with live ranks, and their pids."""
        return dict(self.samples[-1].ranks.get(str(run_dir), {})) if self.samples else {}

    @property
    def max_gap_s(self) -> float:
        """The longest time between two consecutive samples (how closely it watched)."""
        times = [s.at for s in list(self.samples)]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


@pytest.fixture
def watcher(product: Product) -> Iterator[AttemptWatcher]:  # noqa: F811 - the fixture above
    """An :class:`AttemptWatcher` on ``product``'s data folder, started before the test; the test
    fails at teardown if ranks of two attempts of one run were ever alive together."""
    with AttemptWatcher(product.home) as w:
        yield w
    w.assert_never_together()
