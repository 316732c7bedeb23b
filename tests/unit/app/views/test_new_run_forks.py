"""A fork on the New run page (app/views/new_run.py): the form filled from the source run, the
changes shown, the checkpoint it starts from chosen (never another run's by itself), and a fork
that cannot start refused with the reason.
"""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.models import Checkpoint, Event, Run
from db.states import AttemptStatus, RunStatus
from db.vocabulary.settings import Settings
from tests.unit.app.pages import (
    add_attempt,
    add_forkable,
    add_run,
    as_read,
    no_exception,
    open_page,
    queued_runs,
    refusals,
    sessions,
    settings,
    show_section,
    start,
)

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module


def test_a_checkpoint_that_is_not_the_runs_own_is_never_preselected_and_says_whose_it_is(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Issue 52 item 1: a run paused before its first own save lists the ckpt.pt that was in its
    working folder before it started; Resume and Fork preselected it (the newest), and its
    checkpoint list said only "verified: yes"."""
    with sessions() as s:
        run_id = add_run(s, settings, "paused", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.PAUSING,
                         RunStatus.PAUSED)
        add_attempt(s, run_id, 70, AttemptStatus.PAUSED)
        s.add(Checkpoint(run_id=run_id, attempt=1, step=1500, path="/w/out/ckpt.pt", origin="/w/out/ckpt.pt",
                         source="script", bytes=10, sha256="ab" * 32, params_digest="", blocked_s=0.0, total_s=0.0,
                         created_at=time.time(), file_mtime=time.time() - 3600, verified=True,
                         refused_reason="existed before the run started (written at ...): not chosen automatically; "
                                        "probably run 7's ('nanogpt-a'), which recorded the same file at step 1500"))
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert at.selectbox(key=f"resume-from-{run_id}").value is None  # a person chooses it, or nothing
    assert at.selectbox(key=f"fork-from-{run_id}").value is None
    at = show_section(at, "Checkpoints")
    assert any("yes; not this run's own: existed before the run started" in m.value and "probably run 7's" in m.value
               for m in at.markdown), [m.value for m in at.markdown]


def test_fork_opens_the_new_run_form_filled_shows_the_changes_then_queues_the_fork(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    parent, checkpoint = add_forkable(sessions, settings)
    at = open_page("views/run.py", run=str(parent))
    no_exception(at)
    # Fork… in the header lists the checkpoint; its button opens the New run page for it.
    assert at.selectbox(key=f"fork-from-{parent}").value == checkpoint
    at.button(key=f"fork-open-{parent}").click().run()
    no_exception(at)
    assert at.query_params["fork"] == str(parent) and at.query_params["checkpoint"] == str(checkpoint)
    assert at.text_input(key="name").value == "parent-fork"  # every value from the run's config
    assert at.number_input(key="train.max_steps").value == 300
    assert at.number_input(key="train.lr").value == pytest.approx(0.001)
    assert any(f"No changes yet against run #{parent} at step 100" in i.value for i in at.info)
    # AppTest reruns the page it was switched to last, not the one st.switch_page opened: open it.
    at = open_page("views/new_run.py", fork=str(parent), checkpoint=str(checkpoint))
    assert at.text_input(key="name").value == "parent-fork"
    at.number_input(key="train.lr").set_value(0.0005)
    start(at)
    no_exception(at)
    # The first Start shows the changes (not seen before) and asks again; nothing is queued yet.
    changes = next(as_read(i.value) for i in at.info if i.value.startswith("**Changes against"))
    assert f"run #{parent} at step 100** (1)" in changes and "train.lr: 0.001 → 0.0005" in changes
    assert any("press Start again to fork" in w.value for w in at.warning)
    assert [r["id"] for r in queued_runs(sessions)] == [parent]
    start(at)
    no_exception(at)
    runs = queued_runs(sessions)
    assert len(runs) == 2
    with sessions() as s:
        fork = s.get_one(Run, max(r["id"] for r in runs))
        source = json.loads(s.get_one(Run, parent).config_json)
        config = json.loads(fork.config_json)
        assert config == {**source, "name": "parent-fork", "train": {**source["train"], "lr": 0.0005}}
        assert (fork.parent_run_id, fork.parent_step) == (parent, 100)
        assert s.get_one(Checkpoint, checkpoint).pinned  # the fork's origin is kept from retention
        events = [e.message for e in s.query(Event).filter_by(run_id=fork.id, kind="fork")]
        assert events == [f"forked from run {parent} at step 100 with train.lr=0.0005"]


def test_fork_that_switches_to_a_script_outside_the_roots_is_refused(
        settings: Settings, sessions: sessionmaker[Session], tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("elsewhere") / "train.py"
    outside.write_text("print('hello')\n")
    parent, checkpoint = add_forkable(sessions, settings)
    at = open_page("views/new_run.py", fork=str(parent), checkpoint=str(checkpoint))
    no_exception(at)
    at.selectbox(key="workload.kind").set_value("script").run()
    at.text_input(key="workload.script").set_value(str(outside))
    start(at)
    no_exception(at)
    (error,) = refusals(at)
    assert f"workload.script = {str(outside)!r}: {outside.resolve()} is outside" in error
    assert [r["id"] for r in queued_runs(sessions)] == [parent]


def test_a_fork_of_a_checkpoint_that_cannot_be_used_says_why_and_shows_a_fresh_form(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    parent, checkpoint = add_forkable(sessions, settings)
    at = open_page("views/new_run.py", fork=str(parent), checkpoint=str(checkpoint + 1))
    no_exception(at)
    assert any(f"checkpoint={checkpoint + 1}: no such checkpoint in run {parent}" in as_read(e.value)
               for e in at.error)
    assert at.text_input(key="name").value != "parent-fork"
