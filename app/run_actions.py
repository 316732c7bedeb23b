"""The Run page's actions, drawn in its header from one snapshot of the run: Resume ▾, Fork…,
Pause, Cancel, Dump stacks and Rerun, each offered only when it applies to the run's status, and
Edit… (name, tags, note: the same validation and ``edit`` events as ``runyard edit``,
orchestrator/run_edits.py; its inputs sit in a form, so that the header's refresh every few
seconds never submits or loses what a person is typing). :func:`metadata_line` shows the sweep a
trial belongs to, the tags and the note under the title, and :func:`status_badge` a trial stopped
early as "stopped early at step N by sweep S". Resume on such a trial (PRUNED) is its promotion
(`runyard sweep promote`): it continues from its newest verified checkpoint.

Resume from a chosen checkpoint and Cancel act only from the confirm button inside their
popover (one click opens the popover, a second one acts). Fork… opens the New run page filled
from the run's config at the chosen checkpoint (``?fork=RUN&checkpoint=ID``).

:func:`open_run` is how the other pages open a run's page (on its Overview).

Every action has a fixed slot in one horizontal row: an action that does not apply draws an empty
element in its slot, so that when the live panel redraws the row after a status change, a Cancel
that no longer applies is replaced at once rather than left (stale) beside the new badge until the
panel's redraw ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from app import data, style
from db.compare import MAX_RUNS as MAX_COMPARED
from db.states import TERMINAL_VALUES, RunStatus
from orchestrator.format import status_words

CANCELLABLE = {RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.RETRYING, RunStatus.PAUSED,
               RunStatus.PAUSING, RunStatus.PRUNED}
PAUSABLE = {RunStatus.STARTING, RunStatus.RUNNING}
NEW_RUN_PAGE = "views/new_run.py"
RUN_PAGE = "views/run.py"
COMPARE_PAGE = "views/compare.py"
COMPARED = "compare_runs"  # the runs the Compare page shows, kept for "Add to Compare"
SECTION_KEY = "section"  # the Run page's section control (bound to ``?section=``)


def open_run(run_id: int) -> None:
    """Open run ``run_id``'s page on its Overview. The section control is bound to the URL, and
    Streamlit keeps a bound widget's last value across pages: without forgetting it, a run opened
    from the Runs list or from Start would show whatever section the previous run was left on."""
    st.session_state.pop(SECTION_KEY, None)
    st.switch_page(RUN_PAGE, query_params={"run": str(run_id)})


def usable_checkpoints(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The verified, not deleted checkpoints of a run: its own first, newest first (by step, then
    by id: a resumed attempt's checkpoint comes before the superseded one at the same step), then
    the versions refused as not its own (a file that was in the working folder before the run
    started, one a retry failed to load), which a person may pick but which are never preselected."""
    return sorted((c for c in d["checkpoints"] if c["verified"] and not c["deleted"]),
                  key=lambda c: (not c["refused_reason"], c["step"], c["id"]), reverse=True)


def is_superseded(checkpoint: dict[str, Any]) -> bool:
    """Whether a later attempt resumed from an earlier step and so left this checkpoint off the
    run's lineage (the scheduler moves such checkpoints under ``superseded/``)."""
    return "/superseded/" in checkpoint["path"]


def checkpoint_label(checkpoint: dict[str, Any], newest: bool) -> str:
    """How a checkpoint reads in the Resume and Fork lists: its step, the attempt that wrote it,
    and whether it is the newest, superseded, or not the run's own."""
    parts = [f"step {checkpoint['step']}", f"attempt {checkpoint['attempt']}"]
    if checkpoint["source"] == "script":
        parts.append(f"{checkpoint['origin']} #{checkpoint['id']}")
    if newest:
        parts.append("newest")
    if is_superseded(checkpoint):
        parts.append("superseded")
    if checkpoint["refused_reason"]:
        parts.append("not this run's own")
    return " · ".join(parts)


def choose_checkpoint(d: dict[str, Any], usable: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """A select box of the usable checkpoints (the run's newest own preselected; with none of its
    own, nothing is); returns the chosen one, or None. A choice that is no longer listed (deleted
    by retention meanwhile) falls back to the default. A version that is not the run's own says
    why (and whose it probably is) under the box."""
    own = bool(usable) and not usable[0]["refused_reason"]
    labels = {c["id"]: checkpoint_label(c, i == 0 and own) for i, c in enumerate(usable)}
    if st.session_state.get(key) not in labels:
        st.session_state.pop(key, None)
    chosen_id = st.selectbox("From checkpoint", list(labels), format_func=labels.__getitem__, key=key,
                             index=0 if own else None,
                             placeholder="none is the run's own: choose one by name")
    chosen = next((c for c in usable if c["id"] == chosen_id), None)
    if chosen is not None and chosen["refused_reason"]:
        st.caption(f"Not this run's own checkpoint: {style.plain(chosen['refused_reason'])}. Starting from it is "
                   "your choice; runyard never picks it by itself.")
    return chosen


def resume_menu(d: dict[str, Any]) -> None:
    """Resume ▾: a new attempt from any verified checkpoint, after a confirm click."""
    usable = usable_checkpoints(d)
    with st.popover("Resume", icon=":material/replay:", key=f"resume-menu-{d['id']}",
                    help="A new attempt of this run from one of its verified checkpoints"):
        chosen = choose_checkpoint(d, usable, f"resume-from-{d['id']}")
        if chosen is None:
            return
        if chosen is not usable[0] and not chosen["refused_reason"]:
            st.caption(f"What the run did after step {chosen['step']} is kept but marked superseded; "
                       "the new attempt trains again from there.")
        if st.button(f"Resume from step {chosen['step']}", type="primary", icon=":material/play_arrow:",
                     key=f"resume-confirm-{d['id']}"):
            st.toast(style.plain(data.resume_run(d["id"], chosen["id"])))
            st.rerun()


def fork_menu(d: dict[str, Any]) -> None:
    """Fork…: the New run form, filled from this run's config at the chosen checkpoint."""
    usable = usable_checkpoints(d)
    with st.popover("Fork…", icon=":material/call_split:", key=f"fork-menu-{d['id']}",
                    help="A new run that starts from a checkpoint of this one, with settings you change"):
        chosen = choose_checkpoint(d, usable, f"fork-from-{d['id']}")
        if chosen is None:
            return
        st.caption("Opens the New run form filled with this run's config; what you change is shown "
                   "against it before Start.")
        if st.button("Open in the New run form", type="primary", icon=":material/edit_note:",
                     key=f"fork-open-{d['id']}"):
            st.switch_page(NEW_RUN_PAGE, query_params={"fork": str(d["id"]), "checkpoint": str(chosen["id"])})


def pause_button(d: dict[str, Any]) -> None:
    if st.button("Pause", icon=":material/pause:", key=f"pause-{d['id']}",
                 help="Checkpoint, free the devices; Resume continues from that checkpoint"):
        st.toast(style.plain(data.cancel_run(d["id"], mode="pause")))
        st.rerun()  # the new status now, not at the next refresh


def cancel_menu(d: dict[str, Any]) -> None:
    """Cancel: a popover that says what cancelling does, and the button that does it."""
    queued = d["status"] in (RunStatus.QUEUED, RunStatus.RETRYING, RunStatus.PAUSED, RunStatus.PRUNED)
    with st.popover("Cancel", icon=":material/stop:", key=f"cancel-menu-{d['id']}"):
        st.markdown(f"Cancel run #{d['id']}? "
                    + ("No process runs: it ends CANCELLED at once; its checkpoints stay." if queued else
                       "SIGTERM: the ranks finish their step, save a checkpoint and exit; Resume can continue "
                       "from it."))
        if st.button("Cancel run", type="primary", icon=":material/stop:", key=f"cancel-{d['id']}"):
            st.toast(style.plain(data.cancel_run(d["id"])))
            st.rerun()


def stacks_button(d: dict[str, Any]) -> None:
    if st.button("Dump stacks", icon=":material/stacks:", key=f"stacks-{d['id']}",
                 help="Save every rank's Python stack into the attempt's folder; nothing is stopped"):
        st.toast(style.plain(data.dump_stacks(d["id"])))


def rerun_button(d: dict[str, Any]) -> None:
    if st.button("Rerun", icon=":material/restart_alt:", key=f"rerun-{d['id']}",
                 help="A new attempt in the same folder without a checkpoint: for a script that keeps "
                      "its own state there"):
        st.toast(style.plain(data.rerun_run(d["id"])))
        st.rerun()


def resume_held_button(d: dict[str, Any]) -> None:
    """Resume for a run paused before it started: it is queued again from the start."""
    if st.button("Resume", icon=":material/play_arrow:", key=f"resume-held-{d['id']}",
                 help="Paused before it started: Resume queues it again; it starts when a slot frees"):
        st.toast(style.plain(data.resume_run(d["id"])))
        st.rerun()


def promote_menu(d: dict[str, Any]) -> None:
    """Resume of a sweep's trial stopped early: its promotion (`runyard sweep promote`), from its
    newest verified checkpoint, after a confirm click; its steps so far are kept."""
    trial, newest = d["trial"], usable_checkpoints(d)[0]
    with st.popover("Resume", icon=":material/replay:", key=f"promote-menu-{d['id']}",
                    help="Promote this trial: it continues from its newest checkpoint"):
        st.markdown(f"Promote trial {trial['number']} of sweep {trial['sweep_id']}: it continues from its checkpoint "
                    f"at step {newest['step']}, as `runyard sweep promote {trial['sweep_id']} {trial['number']}` "
                    "does; the steps it trained are kept, not trained or counted again.")
        if st.button(f"Promote: continue from step {newest['step']}", type="primary", icon=":material/play_arrow:",
                     key=f"promote-confirm-{d['id']}"):
            st.toast(style.plain(data.resume_run(d["id"])))
            st.rerun()


def status_badge(d: dict[str, Any]) -> str:
    """The run's status badge: a trial stopped early says at which step and by which sweep."""
    return style.badge(d["status"], status_words(d["status"], d["step"], d.get("trial")))


def metadata_line(d: dict[str, Any]) -> None:
    """The sweep a trial belongs to (linked to its page), tags as badges and the note under the run's
    title (nothing when it has none of them)."""
    parts = [" ".join(f":gray-badge[{style.plain(t)}]" for t in d["tags"])] if d["tags"] else []
    if trial := d.get("trial"):
        parts.insert(0, f":material/tune: trial {trial['number']} of [sweep {trial['sweep_id']} "
                        f"{style.plain(trial['sweep_name'])}](sweep?id={trial['sweep_id']})")
    if d.get("note"):
        parts.append(f":material/sticky_note_2: {style.plain(d['note'])}")
    if parts:
        st.markdown(" &nbsp; ".join(parts))


def compare_link(d: dict[str, Any]) -> None:
    """"Add to Compare": the Compare page with this run added to the runs last compared in this
    browser session (alone when none were; the oldest left out past the page's ten)."""
    before = [i for i in st.session_state.get(COMPARED, []) if i != d["id"]]
    runs = [*before[-(MAX_COMPARED - 1):], d["id"]]
    st.page_link(COMPARE_PAGE, label="Add to Compare", icon=":material/stacked_line_chart:",
                 query_params={"runs": ",".join(map(str, runs))},
                 help="Open Compare with this run beside the runs you compared last")


def tag_list(text: str) -> list[str]:
    """The tags in a comma list (``"a, b,,c"`` -> ``["a", "b", "c"]``), as the New run page reads
    its list boxes (app/form_values.py), each once."""
    return list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))


def edit_menu(d: dict[str, Any]) -> None:
    """Edit…: the run's name, tags (a comma list) and note, saved together."""
    run_id = d["id"]
    with (st.popover("Edit…", icon=":material/edit:", key=f"edit-menu-{run_id}",
                     help="Rename the run, change its tags, write a note; each change is kept in its events"),
          st.form(f"edit-form-{run_id}", border=False)):
        name = st.text_input("Name", value=d["name"], key=f"edit-name-{run_id}", max_chars=100,
                             help="Letters, digits, '.', '_' and '-', starting with a letter or digit")
        # A comma list, as on the New run page (one way for both): every tag typed is saved or refused
        # by name on Save, none dropped because Enter was not pressed after it.
        typed = st.text_input("Tags", value=", ".join(d["tags"]), key=f"edit-tags-{run_id}",
                              placeholder="comma separated: baseline, lr-search",
                              help="Comma separated; each letters, digits and . _ : / + = -, at most 40 characters")
        tags = tag_list(typed)
        note = st.text_area("Note", value=d.get("note") or "", key=f"edit-note-{run_id}", max_chars=4000,
                            placeholder="what you tried, what you saw")
        if st.form_submit_button("Save", type="primary", icon=":material/save:"):
            ok, said = data.edit_run(
                run_id, name=name.strip() if name.strip() != d["name"] else None,
                add_tags=tuple(t for t in tags if t not in d["tags"]),
                remove_tags=tuple(t for t in d["tags"] if t not in tags),
                note=note if note.strip() != (d.get("note") or "") else None)
            st.toast(style.plain(said), icon=None if ok else ":material/error:")
            if ok:
                st.rerun()


def offered(d: dict[str, Any]) -> list[tuple[bool, Callable[[dict[str, Any]], None]]]:
    """Each action in its slot's order, with whether it applies to the run as ``d`` shows it."""
    status = d["status"]
    terminal = status in TERMINAL_VALUES
    usable = bool(usable_checkpoints(d))
    script_rerun = terminal and d["config"]["workload"]["kind"] == "script" and not d["imported"]
    promotes = status == "PRUNED" and usable and d.get("trial") is not None  # Resume is the trial's promotion
    return [
        (terminal and usable and not promotes, resume_menu),
        (promotes, promote_menu),
        (status in ("PAUSED", "PRUNED") and not d["attempts"], resume_held_button),
        (usable, fork_menu),
        (status in PAUSABLE, pause_button),
        (status in CANCELLABLE, cancel_menu),
        (status in PAUSABLE, stacks_button),
        (script_rerun, rerun_button),
        (True, edit_menu),
    ]


# What each action is called on its button, for the disabled row of a read-only data folder.
LABELS: dict[Callable[[dict[str, Any]], None], str] = {
    resume_menu: "Resume", promote_menu: "Resume", resume_held_button: "Resume", fork_menu: "Fork…",
    pause_button: "Pause", cancel_menu: "Cancel", stacks_button: "Dump stacks", rerun_button: "Rerun",
    edit_menu: "Edit…",
}


def actions(d: dict[str, Any]) -> None:
    """The header's row of actions for the run as ``d`` (one snapshot) shows it; on a data folder
    that cannot be written, the same actions shown disabled, saying why."""
    viewing = data.read_only_reason()
    with st.container(horizontal=True, key=f"actions-{d['id']}"):
        for applies, draw in offered(d):
            if applies and viewing is not None:
                st.button(LABELS[draw], key=f"viewing-{draw.__name__}-{d['id']}", disabled=True, help=viewing)
            elif applies:
                draw(d)
            else:
                st.empty()
        compare_link(d)
