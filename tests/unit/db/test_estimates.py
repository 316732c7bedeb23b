"""The New run page's estimate before Start: the pace of the most alike earlier run on this
database, its start-up, the machine's price; rough when only the workload matches; none
without an earlier run; a fork's steps from its checkpoint on; none for a run Start would refuse.

A queued run's start estimate in the run summary (queue_starts, through db/run_list.py): behind a
running run it starts when that run's pace says it ends, and later when that run slows down; a
run ahead of unknown length is named; a Slurm run says Slurm decides; the whole list's estimates
cost the same statements for 1 queued run as for 5. Rows are written as the scheduler writes them
(the run walked through its states, its attempt RUNNING, rank 0's progress through the metric
store), on the machine the scheduler publishes in its heartbeat file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from db import run_list
from db.estimates import published_machine, queue_starts, start_estimate
from db.metricstore import write_points
from db.models import Attempt, Checkpoint, Run
from db.requests import create_run
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.inventory import Inventory
from db.vocabulary.scheduler_file import SchedulerFile
from db.vocabulary.settings import Settings
from orchestrator.format import estimate_text
from tests.unit.app.pages import add_forkable, as_read, open_page, sessions, settings
from tests.unit.db.statements import counted, statements

# The pages' fixtures: each test's own home, and Streamlit's caches (the app's engine) emptied for it;
# the statements any engine sends.
__all__ = ["sessions", "settings", "statements"]
PRICE = Price(usd_per_hour=0.36, unit="2/2 of a CPU node @ $0.36/h")


def add_trained(session: Session, settings: Settings, steps_per_s: float, startup_s: float, **train: object) -> int:
    """A run that trained 1,000 steps at ``steps_per_s`` after ``startup_s`` of start-up."""
    config = RunConfig.model_validate({"name": f"past-{steps_per_s}", "train": {"max_steps": 1000, **train}})
    run = create_run(session, config, settings.runs_dir, PRICE)
    session.flush()
    start = time.time() - 3600
    run.started_at = start
    first = start + startup_s
    session.add(Attempt(run_id=run.id, number=1, status="SUCCEEDED", dir=str(Path(run.run_dir) / "1"),
                        started_at=start, first_step_at=first, ended_at=first + 1000 / steps_per_s,
                        last_step=1000, resume_step=0))
    session.flush()
    return run.id


def test_the_pace_of_the_alike_run_gives_time_and_cost(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as s:
        alike = add_trained(s, settings, steps_per_s=50.0, startup_s=12.0)
        add_trained(s, settings, steps_per_s=5.0, startup_s=30.0, batch_size=512)  # newer, other batch size
        e = start_estimate(s, RunConfig.model_validate({"train": {"max_steps": 3000}}).as_dict(), PRICE)
    assert (e.like_run, e.exact) == (alike, True)
    assert e.steps_per_s == pytest.approx(50.0)
    assert e.seconds == pytest.approx(12.0 + 3000 / 50.0)
    assert e.cost_usd == pytest.approx(72.0 * 0.36 / 3600)
    assert estimate_text(e).startswith(f"About 1m 12s and $0.0072: 3,000 steps at 50 steps/s as run #{alike}")


def test_another_batch_size_gives_a_rough_estimate_and_nothing_alike_gives_the_price_only(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    config = RunConfig.model_validate({"train": {"max_steps": 3000, "batch_size": 32}}).as_dict()
    with sessions.begin() as s:
        none = start_estimate(s, config, PRICE)
        other = add_trained(s, settings, steps_per_s=40.0, startup_s=10.0)
        rough = start_estimate(s, config, PRICE)
        four_ranks = start_estimate(s, {**config, "launch": {"nproc_per_node": 4, "backend": "auto"}}, PRICE)
    assert none.seconds is None
    assert estimate_text(none) == ("no earlier run of this workload with these ranks has trained here, so no time "
                                   "yet. It will cost $0.36 per hour (2/2 of a CPU node @ $0.36/h); the Run page "
                                   "shows the ETA once it trains.")
    assert (rough.like_run, rough.exact) == (other, False)
    assert "(rough)" in estimate_text(rough)
    assert four_ranks.like_run is None  # another number of ranks trains at another pace


def test_the_new_run_page_shows_the_estimate_before_start(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as s:
        past = add_trained(s, settings, steps_per_s=100.0, startup_s=15.0)
    at = open_page("views/new_run.py")
    shown = [as_read(i.value) for i in at.info if i.value.startswith("**Estimate**")]  # escaped Markdown, as read
    # The form's first run: 3,000 steps at the earlier run's 100 steps/s, plus its 15 s start-up.
    assert shown and "About 45s and $" in shown[0] and f"run #{past}" in shown[0], shown


def estimates_shown(at: object) -> list[str]:
    return [as_read(i.value) for i in at.info if i.value.startswith(("**Estimate**", "**No estimate**"))]  # type: ignore[attr-defined]


def test_a_fork_is_priced_for_the_steps_it_trains_from_its_checkpoint(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """A fork of a 300-step run from its checkpoint at step 100 trains 200 steps; before, the page
    priced all 300."""
    parent, checkpoint = add_forkable(sessions, settings)
    with sessions.begin() as s:
        past = add_trained(s, settings, steps_per_s=100.0, startup_s=15.0)
    at = open_page("views/new_run.py", fork=str(parent), checkpoint=str(checkpoint))
    (shown,) = estimates_shown(at)
    assert shown.startswith("**Estimate**: About 17s and $") and \
        f": 200 steps (from step 100 to 300) at 100 steps/s as run #{past} " in shown, shown
    with sessions() as s:
        e = start_estimate(s, RunConfig.model_validate({"train": {"max_steps": 300}}).as_dict(), PRICE, from_step=100)
    assert (e.steps, e.seconds) == (200, pytest.approx(15.0 + 2.0))


def test_a_config_start_would_refuse_is_not_priced_and_the_cpu_slots_are_named(settings: Settings) -> None:
    at = open_page("views/new_run.py")
    at.number_input(key="launch.nproc_per_node").set_value(64)
    next(b for b in at.button if b.label == "Update estimate").click().run()
    (shown,) = estimates_shown(at)
    assert shown.startswith("**No estimate**: as set, Start would refuse it:") and "RUNYARD_CPU_SLOTS=64" in shown
    next(b for b in at.button if b.label == "Start").click().run()
    assert estimates_shown(at) == ["**No estimate**: fix the problems above first"]
    assert any("RUNYARD_CPU_SLOTS=64 runyard up" in as_read(e.value) for e in at.error)


# --- a queued run's start estimate ------------------------------------------------------------

QUEUE_PRICE = Price(usd_per_hour=0.1, unit="1/2 of a CPU node @ $0.10/h")


def publish(settings: Settings, slots: int = 2) -> None:
    """The machine a scheduler publishes on its heartbeat: ``slots`` CPU slots."""
    SchedulerFile(settings.scheduler_file).write({"inventory": Inventory(kind="cpu", slots=slots).to_json()})


def submit(s: Session, settings: Settings, name: str, nproc: int = 2, max_steps: int = 1000,
           executor: str = "local") -> int:
    """A run submitted (QUEUED) with ``nproc`` ranks of ``max_steps`` steps."""
    launch: dict[str, object] = {"nproc_per_node": nproc, "executor": executor}
    if executor == "slurm":
        launch["backend"] = "gloo"
    config = RunConfig.model_validate({"name": name, "train": {"max_steps": max_steps}, "launch": launch})
    run = create_run(s, config, settings.runs_dir, QUEUE_PRICE)
    s.flush()
    return run.id


def start(s: Session, run_id: int, started_at: float) -> None:
    """The scheduler's launch: STARTING, then RUNNING at the first step, its attempt RUNNING."""
    for status in (RunStatus.STARTING, RunStatus.RUNNING):
        assert transition(s, run_id, status, "test")
    s.add(Attempt(run_id=run_id, number=1, status="RUNNING", dir=str(Path("/nowhere") / str(run_id)),
                  executor="local", started_at=started_at, first_step_at=started_at + 5, resume_step=0))
    s.flush()


def progress(s: Session, run_id: int, steps: range, first_at: float, steps_per_s: float) -> float:
    """Rank 0's loss at ``steps``, ``steps_per_s`` apart from ``first_at``; the last point's time."""
    times = [first_at + (step - steps.start) / steps_per_s for step in steps]
    write_points(s.connection(), [{"run_id": run_id, "attempt": 1, "rank": 0, "step": step, "key": "loss",
                                   "value": 1.0, "wall_time": t} for step, t in zip(steps, times, strict=True)])
    attempt = s.scalars(select(Attempt).where(Attempt.run_id == run_id, Attempt.number == 1)).one()
    attempt.last_step, attempt.progress_at = steps[-1], times[-1]
    s.flush()
    return times[-1]


def estimates_of(sessions: sessionmaker[Session], now: float) -> dict[int, Any]:
    with sessions() as s:
        return {r["id"]: r["start_estimate"] for r in run_list.list_runs(s, now=now)}


def test_a_queued_run_starts_when_the_run_ahead_ends_and_later_when_it_slows_down(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    publish(settings, slots=2)
    now = time.time()
    with sessions.begin() as s:
        ahead = submit(s, settings, "ahead")
        start(s, ahead, started_at=now - 110)
        last = progress(s, ahead, range(0, 101, 10), first_at=now - 100, steps_per_s=1.0)  # 900 steps to go
        queued = submit(s, settings, "queued")
    first = estimates_of(sessions, now)
    assert first[ahead] is None
    assert first[queued] == {"at": pytest.approx(last + 900), "after_run": ahead,
                             "basis": f"after run {ahead} ends, by that run's predicted end"}
    # The run ahead slows to half its pace: newer points, and the queued run starts later.
    with sessions.begin() as s:
        slower = progress(s, ahead, range(110, 201, 10), first_at=now + 20, steps_per_s=0.5)
    moved = estimates_of(sessions, now + 200)[queued]
    assert moved is not None and moved["after_run"] == ahead
    assert moved["at"] > first[queued]["at"] + 300
    assert moved["at"] > slower


def test_a_retrying_run_ahead_pays_its_restart_and_redoes_its_steps_before_the_queued_one_starts(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """The run ahead failed at step 900 of 1000 with its newest checkpoint at 500: before the queued
    run starts it waits out its backoff, starts again (its own first start-up: 5 s) and trains the
    500 steps from the checkpoint, as its own page's ETA says; not the 100 steps after 900."""
    publish(settings, slots=2)
    now = time.time()
    with sessions.begin() as s:
        ahead = submit(s, settings, "ahead")
        start(s, ahead, started_at=now - 1000)
        progress(s, ahead, range(0, 901, 10), first_at=now - 995, steps_per_s=1.0)
        s.add(Checkpoint(run_id=ahead, attempt=1, step=500, path="/nowhere/step-500", bytes=1, sha256="0" * 64,
                         params_digest="0" * 16, blocked_s=0.1, total_s=0.1, created_at=now - 500, verified=True))
        attempt = s.scalars(select(Attempt).where(Attempt.run_id == ahead)).one()
        attempt.status, attempt.ended_at, attempt.cause = "FAILED", now - 90, "EXCEPTION"
        assert transition(s, ahead, RunStatus.RETRYING, "test")
        s.get_one(Run, ahead).retry_at = now + 30
        queued = submit(s, settings, "queued")
    got = estimates_of(sessions, now)
    assert got[queued]["after_run"] == ahead
    assert got[queued]["at"] == pytest.approx(now + 30 + 5 + 500, abs=2)
    with sessions() as s:
        shown = run_list.list_runs(s, now=now)
    assert [r["eta_s"] for r in shown if r["id"] == ahead] == [pytest.approx(30 + 5 + 500, abs=2)]


def test_a_run_ahead_past_its_prediction_is_pushed_later_never_into_the_past(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    publish(settings, slots=2)
    now = time.time()
    with sessions.begin() as s:
        ahead = submit(s, settings, "stuck")
        start(s, ahead, started_at=now - 3000)
        # Its pace said it would end 1,800 s ago (900 steps at 1 step/s from its last point); it still runs.
        progress(s, ahead, range(0, 101, 10), first_at=now - 2800, steps_per_s=1.0)
        queued = submit(s, settings, "queued")
    got = estimates_of(sessions, now)[queued]
    # Its band's slow end is behind it too: now plus a tenth of the 3,000 s its attempt has run.
    assert got["at"] == pytest.approx(now + 300, abs=1)
    assert got["basis"] == f"after run {ahead}, which has outlived its predicted end (its end is pushed later)"


def test_a_gpu_run_needing_more_gpus_than_are_free_waits_for_the_run_that_frees_enough(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    SchedulerFile(settings.scheduler_file).write(
        {"inventory": Inventory(kind="gpu", slots=4, gpu_names=("H100",) * 4).to_json()})
    now = time.time()
    with sessions.begin() as s:
        short, long = submit(s, settings, "two-gpus-short"), submit(s, settings, "one-gpu-long", nproc=1)
        start(s, short, started_at=now - 110)
        short_end = progress(s, short, range(0, 101, 10), first_at=now - 100, steps_per_s=1.0) + 900
        start(s, long, started_at=now - 110)
        progress(s, long, range(0, 101, 10), first_at=now - 100, steps_per_s=0.1)  # 9,000 s to go
        queued = submit(s, settings, "needs-two")  # 1 GPU is free; it needs 2
    got = estimates_of(sessions, now)[queued]
    assert (got["at"], got["after_run"]) == (pytest.approx(short_end), short)


def test_a_run_ahead_of_unknown_length_is_named_and_slurm_runs_are_left_to_slurm(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    publish(settings, slots=2)
    now = time.time()
    with sessions.begin() as s:
        ahead = submit(s, settings, "first-of-its-kind")  # no pace yet, no earlier run like it
        start(s, ahead, started_at=now - 60)
        queued = submit(s, settings, "waits")
        cluster = submit(s, settings, "on-slurm", executor="slurm")
    got = estimates_of(sessions, now)
    assert got[queued] == {"at": None, "after_run": ahead, "basis": f"after run {ahead}, whose length is not known"}
    assert got[cluster] == {"at": None, "after_run": None,
                            "basis": "Slurm decides when it starts (runyard has no estimate of the cluster's queue)"}


def test_without_a_scheduler_the_machine_is_not_known_and_no_time_is_made_up(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as s:
        queued = submit(s, settings, "waits")
    assert published_machine(settings) is None
    assert estimates_of(sessions, time.time())[queued]["at"] is None


@pytest.mark.parametrize("queued", [1, 5])
def test_the_start_estimates_cost_the_same_statements_however_many_are_queued(
        settings: Settings, sessions: sessionmaker[Session], statements: list[tuple[Engine, str]],
        queued: int) -> None:
    publish(settings, slots=2)
    now = time.time()
    with sessions.begin() as s:
        ahead = submit(s, settings, "ahead")
        start(s, ahead, started_at=now - 110)
        progress(s, ahead, range(0, 101, 10), first_at=now - 100, steps_per_s=1.0)
        waiting = [submit(s, settings, f"q{i}") for i in range(queued)]
    runs, sent = counted(sessions, statements, lambda s: run_list.list_runs(s, now=now))
    # The list's own seven reads (energy among them), the holders, the queue, the alike runs and their attempts; the
    # holders' points come with the live runs' (one read of metric points).
    assert len(sent) == 11, "\n".join(sql[:70] for sql in sent)
    assert sum("FROM metric_points" in sql for sql in sent) == 1
    with sessions() as s:
        alone = queue_starts(s, now, published_machine(settings))
    assert [alone[w].as_dict() for w in waiting] == [r["start_estimate"] for r in reversed(runs[:queued])]
    assert all(alone[w].at is not None for w in waiting)
