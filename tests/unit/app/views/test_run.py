"""The Run page (app/views/run.py) on a real, seeded database: its header, progress, attempts and
actions, the run it opens on, a failure named at its top, the checkpoints and their advice, the
logs of its ranks, and what Cancel writes.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from app.log_view import OWN_FRAME_ROOTS
from db.models import Attempt, Checkpoint, Event, Run
from db.states import AttemptStatus, RunStatus, transition
from db.vocabulary.settings import Settings, load_settings
from tests.unit.app.pages import (
    EVIL,
    add_attempt,
    add_failed_run,
    add_metrics,
    add_run,
    as_read,
    no_exception,
    open_page,
    seeded,
    sessions,
    settings,
    show_section,
)

__all__ = ["seeded", "sessions", "settings"]  # the fixtures, from the helper module


# -- Run page -------------------------------------------------------------------------------


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_run_page_shows_header_progress_attempts_and_metrics(seeded: dict[str, int]) -> None:
    run_id = seeded["running"]
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert at.selectbox[0].value == run_id
    assert at.selectbox[0].options == [f"#{run_id} digits-a", f"#{seeded['queued']} queued-one"]
    header = at.markdown[0].value
    assert f"#{run_id} digits-a" in header
    assert "RUNNING" in header and "blue-badge" in header
    assert at.progress[0].value == 40
    assert at.progress[0].proto.text == "step 120 / 300"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Eval accuracy"] == "87.5%"  # as the metric registry shows a share
    assert metrics["Attempts"] == "1"
    assert re.fullmatch(r"\d\d:\d\d", metrics["Ends at"])  # a running run with progress: the time it ends
    assert "Ended at" not in metrics and any(c.value.startswith("**Cost so far**") for c in at.caption)
    # The tile's help says what the ETA is based on.
    ends = next(m for m in at.metric if m.label == "Ends at")
    assert "steps' pace over" in ends.proto.help and "evaluation and checkpoint pauses included" in ends.proto.help
    # The actions in the header, where they apply: no Resume or Fork without a checkpoint; Cancel
    # acts from the confirm button inside its popover.
    assert [b.label for b in at.button] == ["Pause", "Cancel run", "Dump stacks", "Save"]  # Save: Edit…'s form
    show_section(at, "Attempts")
    attempts = at.dataframe[0].value
    assert attempts["attempt"].tolist() == [1]
    assert attempts["status"].tolist() == ["RUNNING"]
    assert attempts["last step"].tolist() == ["120"]
    assert attempts["exit"].tolist() == ["still running"]  # never "None" (issue 56, item 2)


def test_run_page_query_param_selects_the_run(seeded: dict[str, int]) -> None:
    at = open_page("views/run.py", run=str(seeded["queued"]))
    no_exception(at)
    assert f"#{seeded['queued']} queued-one" in at.markdown[0].value
    assert "QUEUED" in at.markdown[0].value
    assert at.progress[0].proto.text == "step 0 / 300"
    # When it should start (no scheduler has published this machine here, so not known), then why it waits.
    start, reason = at.caption[0].value.split("; ")
    assert start.startswith("start not known")
    # Where the charts will be: what the run waits for (its status sentence), not a bare "waiting".
    show_section(at, "Metrics")
    assert any(i.value == reason for i in at.info), (reason, [i.value for i in at.info])
    assert not at.get("vega_lite_chart")
    show_section(at, "Attempts")
    assert any(c.value == "Not launched yet." for c in at.caption)
    show_section(at, "Logs")
    assert any(c.value == "Not launched yet: no logs." for c in at.caption)


def test_run_page_unknown_run_falls_back_to_newest(seeded: dict[str, int]) -> None:
    at = open_page("views/run.py", run="999")
    no_exception(at)
    assert at.selectbox[0].value == seeded["running"]
    assert at.query_params["run"] == str(seeded["running"])


def test_run_page_without_runs(settings: Settings) -> None:
    at = open_page("views/run.py")
    no_exception(at)
    assert "No runs yet" in at.info[0].value


def test_finished_run_has_no_cancel_button(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        run_id = add_run(s, settings, "done", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
        add_attempt(s, run_id, last_step=300, status=AttemptStatus.SUCCEEDED)
        add_metrics(s, run_id, last_step=300)
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert "SUCCEEDED" in at.markdown[0].value
    assert at.progress[0].value == 100
    # Finished: when it ended and what it cost, not "Ends at –" and "Cost so far".
    metrics = {m.label: m.value for m in at.metric}
    assert re.fullmatch(r"\d\d:\d\d", metrics["Ended at"]) and metrics["Cloud reference"].startswith("$")
    assert "Ends at" not in metrics and any(c.value.startswith("**Cost** ·") for c in at.caption)
    assert not any(c.value.startswith("**Cost so far**") for c in at.caption)
    assert [b.label for b in at.button] == ["Save"]  # Edit…'s form alone: no Cancel


def element_path(node: Any, match: Callable[[Any], bool]) -> list[int] | None:
    """The delta path (indices from the page's root) of the first element ``match`` accepts."""
    for index, child in sorted(getattr(node, "children", {}).items()):
        if match(child):
            return [index]
        inner = element_path(child, match)
        if inner is not None:
            return [index, *inner]
    return None


def test_the_headline_numbers_keep_their_place_while_a_run_retries(settings: Settings,
                                                                    sessions: sessionmaker[Session]) -> None:
    """Streamlit matches a redrawn element to the one before by its place in the page: when a
    retry's warning and failure summary were drawn above the headline numbers, the new numbers
    came a few places further down, and the old ones stayed until the redraw ended (issue 29:
    "two copies of the headline tiles were in the page at once during a retry")."""
    def elapsed(at: AppTest) -> list[int] | None:
        return element_path(at._tree, lambda e: getattr(e, "type", None) == "metric" and e.label == "Elapsed")

    with sessions() as s:
        run_id = add_run(s, settings, "retrying", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, last_step=120)
        add_metrics(s, run_id, last_step=120)
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    running = elapsed(at)
    assert running is not None
    with sessions() as s:  # attempt 1 failed: a failure summary, a reason and a retry warning
        attempt = s.query(Attempt).filter_by(run_id=run_id).one()
        attempt.status, attempt.cause, attempt.failed_rank, attempt.exit_code = "FAILED", "SIGNAL", 1, -9
        attempt.exception, attempt.ended_at = "killed by SIGKILL", time.time()
        assert transition(s, run_id, RunStatus.RETRYING, "rank 1 was killed (SIGKILL); retrying from step 100")
        s.get_one(Run, run_id).retry_at = time.time() + 30
        s.commit()
    st.cache_data.clear()
    at.run()
    no_exception(at)
    assert any("Retrying: next attempt at" in w.value for w in at.warning)
    assert elapsed(at) == running


def test_run_page_checkpoint_advice(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    at = show_section(open_page("views/run.py", run=str(run_id)), "Checkpoints")
    advice = next(c.value for c in at.caption if "Young–Daly" in c.value)
    assert "not enough data yet" in advice and "no checkpoint written yet" in advice
    assert "configured: every 100 steps" in advice.lower()
    now = time.time()
    with sessions() as s:
        # 2 s blocked per save; one failure in 2 h of attempts on this machine (plus the 60 s of
        # the seeded attempt); the seeded attempt made 119 steps in 55 s.
        s.add(Checkpoint(run_id=run_id, attempt=1, step=100, path="/c/step-100", bytes=10, sha256="0",
                         params_digest="0", blocked_s=2.0, total_s=9.0, created_at=now))
        other = add_run(s, load_settings(), "crashed")
        s.add(Attempt(run_id=other, number=1, status="FAILED", dir="/x", started_at=now - 7200, ended_at=now,
                      cause="SIGNAL"))
        s.commit()
    st.cache_data.clear()
    at.run()
    no_exception(at)
    advice = next(c.value for c in at.caption if "Young–Daly" in c.value)
    assert advice.startswith("Young–Daly suggests every ~")
    assert "given save cost 2 s and MTBF 2 h" in advice
    assert "configured: every 100 steps" in advice


# -- Cancel ---------------------------------------------------------------------------------


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_cancel_running_run_moves_it_to_cancelling(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    at = open_page("views/run.py", run=str(run_id))
    at.button(key=f"cancel-{run_id}").click().run()
    no_exception(at)
    assert "cancel requested" in at.toast[0].value
    with sessions() as s:
        run = s.get_one(Run, run_id)
        assert run.status == RunStatus.CANCELLING.value
        assert run.status_reason == "cancel requested by ui"
    # The header was drawn before the button in that script run; the next refresh (the live
    # fragment reruns every 2 s) shows the new status, and no Cancel button any more.
    at.run()
    assert "CANCELLING" in at.markdown[0].value
    assert [b.label for b in at.button] == ["Save"]  # Edit…'s form alone: no Cancel, no Pause


def test_cancel_queued_run_cancels_it_at_once(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["queued"]
    at = open_page("views/run.py", run=str(run_id))
    at.button(key=f"cancel-{run_id}").click().run()
    no_exception(at)
    with sessions() as s:
        assert s.get_one(Run, run_id).status == RunStatus.CANCELLED.value


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_the_pin_toggle_pins_once_and_a_refused_pin_springs_back(settings: Settings,
                                                                 sessions: sessionmaker[Session]) -> None:
    now = time.time()
    with sessions() as s:
        run_id = add_run(s, settings, "pins", RunStatus.CANCELLED)
        add_attempt(s, run_id, 200, AttemptStatus.CANCELLED)
        ours = Checkpoint(run_id=run_id, attempt=1, step=100, path="/c/step-100", bytes=10, sha256="0",
                          params_digest="0", blocked_s=1.0, total_s=2.0, created_at=now)
        gone = str(settings.home / "out" / "ckpt.pt")  # the script's file, no longer on disk
        theirs = Checkpoint(run_id=run_id, attempt=1, step=200, path=gone, origin=gone, source="script", bytes=10,
                            sha256="1" * 64, params_digest="", blocked_s=0.0, total_s=0.0, created_at=now,
                            file_mtime=now)
        s.add_all([ours, theirs])
        s.commit()
        ours_id, theirs_id = ours.id, theirs.id
    at = show_section(open_page("views/run.py", run=str(run_id)), "Checkpoints")
    at.toggle(key=f"pin-{ours_id}").set_value(True).run()
    no_exception(at)
    at.toggle(key=f"pin-{theirs_id}").set_value(True).run()
    no_exception(at)
    (error,) = [e.value for e in at.error]
    assert error.startswith(f"cannot pin checkpoint {theirs_id}")
    assert at.toggle(key=f"pin-{theirs_id}").value is False  # back off: not asked again on each refresh
    with sessions() as s:
        assert (s.get_one(Checkpoint, ours_id).pinned, s.get_one(Checkpoint, theirs_id).pinned) == (True, False)
    at.run()
    assert not at.error


def test_a_failed_run_names_the_failing_rank_and_its_exception_at_the_top(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    tail = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"train.py\", line 74, in _run_batch\n"
            "[rank1]: ValueError: bad batch at step 50\n")
    run_id = add_failed_run(sessions, settings, "ValueError: bad batch at step 50 (at train.py:74 in _run_batch)",
                            tail)
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    # One line at the top: the label of a closed section that holds the traceback.
    (failure,) = [e for e in at.expander if e.label.startswith("**Attempt 1")]
    assert failure.label == (r"**Attempt 1: rank 1 failed (USER_ERROR)**: ValueError\: bad batch at step 50 "
                             r"\(at train.py\:74 in \_run\_batch\)"), failure.label
    assert not failure.proto.expanded and not at.error
    assert r"First error line: Traceback \(most recent call last\)\:" in [c.value for c in at.caption]
    assert tail.strip() in [c.value for c in at.code]


def test_a_ranks_log_is_searched_highlighted_opened_at_its_first_error_and_downloadable(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Issue 29, item 9, on the page: the Logs section opens on the failing rank's log, read from the
    run's folder, its markup shown as text; a search lists the matching lines with the matches
    marked; First error shows the log from the traceback; the rank's log and all of them download."""
    run_id = add_failed_run(sessions, settings, "ValueError: boom", "[rank1]: ValueError: boom\n")
    with sessions() as s:
        attempt_dir = Path(s.query(Attempt).filter_by(run_id=run_id).one().dir)
    body = "".join(f"step {i} loss {1 / i:.3f}\n" for i in range(1, 400))
    for rank in (0, 1):
        folder = attempt_dir / "ranks" / "abc_1" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stdout.log").write_text(body if rank == 1 else "rank 0 waits\n")
        (folder / "stderr.log").write_text(f"[rank1]: Traceback (most recent call last):\n[rank1]: ValueError: {EVIL}\n"
                                           if rank == 1 else "")
    at = show_section(open_page("views/run.py", run=str(run_id)), "Logs")
    no_exception(at)
    assert at.selectbox(key=f"log-source-{run_id}").value == "rank 1"  # the failing rank
    logs = [h.proto.body for h in at.html if "runyard-log" in h.proto.body and "<pre>" in h.proto.body]
    stderr, stdout = logs  # in the files' order
    assert "step 399 loss" in stdout and "step 99 loss" not in stdout  # its end (the last 300 lines)
    assert "<img" not in stderr and "&lt;img src=x&gt;" in stderr
    assert "runyard-log-follow" not in stdout  # a finished run's log is not followed

    at.text_input(key=f"log-search-{run_id}").input("loss 0.5").run()
    stdout = [h.proto.body for h in at.html if "<pre>" in h.proto.body][1]
    assert stdout.count("<mark>loss 0.5</mark>") == 1 and "step 2 " in stdout  # "step 2 loss 0.500"
    assert any(as_read(c.value).startswith("stdout.log: 1 line(s) with") for c in at.caption)

    at.text_input(key=f"log-search-{run_id}").input("").run()
    at.button(key=f"log-error-button-{run_id}").click().run()
    assert any(as_read(c.value) == "stderr.log: from the first error, line 1" for c in at.caption)
    error_log = next(h.proto.body for h in at.html if "runyard-log-error" in h.proto.body)
    assert "Traceback" in error_log
    at.button(key=f"log-prepare-zip-{run_id}").click().run()
    (save,) = at.get("download_button")
    assert save.proto.label.startswith(f"Save run-{run_id}-logs.zip")


def test_the_logs_section_reads_a_traceback_from_the_users_code_and_filters_by_level(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Issue 56, item 5: the log first in its section; runyard's own frames folded into one line,
    here and in the kept tail; the level filter keeps the chosen levels."""
    trainer = OWN_FRAME_ROOTS[0]
    trace = ("[rank1]: Traceback (most recent call last):\n"
             f'[rank1]:   File "{trainer}script_runner.py", line 88, in main\n[rank1]:     runpy.run_path(script)\n'
             '[rank1]:   File "/home/me/train.py", line 5, in <module>\n[rank1]:     boom()\n'
             "[rank1]: RuntimeError: boom\n")
    run_id = add_failed_run(sessions, settings, "RuntimeError: boom", trace)
    with sessions() as s:
        folder = Path(s.query(Attempt).filter_by(run_id=run_id).one().dir) / "ranks" / "abc_1" / "attempt_0" / "1"
    folder.mkdir(parents=True)
    (folder / "stderr.log").write_text("step 1 loss 2.0\n[rank1]: UserWarning: slow data\n" + trace)
    at = show_section(open_page("views/run.py", run=str(run_id)), "Logs")
    log_at = element_path(at._tree, lambda e: getattr(e, "type", None) == "html" and "<pre>" in e.proto.body)
    tail_at = element_path(at._tree, lambda e: getattr(e, "type", None) == "expander"
                           and str(e.label).startswith("Attempt 1"))
    assert log_at is not None and tail_at is not None and log_at < tail_at  # the log first, the kept tail under it
    (log,) = [h.proto.body for h in at.html if "<pre>" in h.proto.body]
    assert "… 1 runyard frame (trainer/script_runner.py)" in log and "line 88" not in log
    assert "/home/me/train.py" in log and "step 1 loss" in log and "UserWarning" in log
    assert all("line 88" not in c.value and "runyard frame" in c.value for c in at.code)  # the kept tail too
    at.pills(key=f"log-levels-{run_id}").set_value(["error", "warning"]).run()
    (log,) = [h.proto.body for h in at.html if "<pre>" in h.proto.body]
    assert "step 1 loss" not in log and "UserWarning" in log and "RuntimeError: boom" in log
    assert any(as_read(c.value).endswith("error, warning lines only") for c in at.caption)


def test_edit_on_the_run_page_renames_tags_and_notes_and_keeps_each_change(
        seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    at.text_input(key=f"edit-name-{run_id}").input("digits-b")
    at.text_input(key=f"edit-tags-{run_id}").input("lr-sweep")  # a comma list, as on the New run page
    at.text_area(key=f"edit-note-{run_id}").input("lr 3e-4 diverged at step 90")
    next(b for b in at.button if b.label == "Save").click().run()
    no_exception(at)
    with sessions() as s:
        run = s.get_one(Run, run_id)
        assert (run.name, json.loads(run.tags_json), run.note) == ("digits-b", ["lr-sweep"],
                                                                   "lr 3e-4 diverged at step 90")
        edits = s.scalars(select(Event.message).where(Event.run_id == run_id, Event.kind == "edit")
                          .order_by(Event.id)).all()
    assert edits == ["renamed 'digits-a' to 'digits-b' by ui", "tag 'lr-sweep' added by ui",
                     "note set: 'lr 3e-4 diverged at step 90' by ui"]
    at.run()
    header = " ".join(m.value for m in at.markdown)
    assert "digits-b" in header and "lr-sweep" in header and "diverged at step 90" in header
    at.text_input(key=f"edit-name-{run_id}").input("bad name")
    next(b for b in at.button if b.label == "Save").click().run()
    assert "name 'bad name': use letters, digits" in at.toast[0].value.replace("\\", "")  # Markdown-escaped
