"""The UI's access to the database: one cached engine, cached query results (plain data).

Pages call these functions; they hold no SQL and no ORM objects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import streamlit as st
from sqlalchemy.orm import Session, sessionmaker

from db import compare, efficiency, estimates, metricstore, queries, run_list, run_summary
from db.engine import make_engine, make_read_only_engine, make_sessionmaker
from db.estimates import StartEstimate
from db.home import home_writable
from db.metricstore import Series, series
from db.requests import (
    RequestRefused,
    RunNotFound,
    request_cancel,
    request_rerun,
    request_stack_dump,
    set_pinned,
    set_prices,
)
from db.sweeps.requests import resume_or_promote
from db.vocabulary.config import RunConfig, deep_merge
from db.vocabulary.cost import config_price
from db.vocabulary.inventory import Inventory
from db.vocabulary.scheduler_file import read_scheduler_file
from db.vocabulary.settings import Settings, load_settings
from orchestrator import run_edits
from orchestrator.alerts.store import AlertStore
from orchestrator.scheduler.resources import detect_inventory
from orchestrator.scripts.allowed_roots import ScriptRoots, changes_what_runs, script_roots
from orchestrator.submission import ChannelCheck, fork, submit, validate


@st.cache_resource
def settings() -> Settings:
    return load_settings()


@st.cache_resource
def read_only_reason() -> str | None:
    """Why this UI can only show its data folder (it cannot be written: an archived copy, a
    read-only mount); ``None`` when it can be written. Every action is then disabled."""
    if home_writable(settings()):
        return None
    return (f"the data folder {settings().home} cannot be written (a read-only mount or an archived copy), so "
            "runs can be looked at but not started, changed or cancelled here; to act on them, copy the folder "
            "somewhere writable and start `runyard ui` with RUNYARD_HOME set to the copy")


@st.cache_resource
def sessions() -> sessionmaker[Session]:
    if read_only_reason() is not None:
        return make_sessionmaker(make_read_only_engine(settings().db_url))
    return make_sessionmaker(make_engine(settings().db_url))


def inventory() -> Inventory:
    """What the scheduler detected and published on its heartbeat (the UI never calls NVML);
    without a heartbeat yet, this machine's CPUs."""
    record = read_scheduler_file(settings().scheduler_file) or {}
    published = record.get("inventory")
    if isinstance(published, dict):
        try:
            return Inventory.from_json(published)
        except (KeyError, TypeError, ValueError):
            pass  # an older scheduler's record
    return detect_inventory(nvml=False)


@st.cache_resource
def launch_roots() -> ScriptRoots:
    """The folders a UI user's scripts and text files must lie under, read once at start from
    RUNYARD_SCRIPT_ROOTS, else the folder the UI was started in and the data folder."""
    return script_roots(os.environ, Path.cwd(), settings().home)


@st.cache_data(ttl=1.0, show_spinner=False)
def scheduler_status() -> dict[str, Any]:
    with sessions()() as s:
        return queries.scheduler_status(s, heartbeat_file=settings().scheduler_file)


@st.cache_data(ttl=1.0, show_spinner=False)
def list_runs(statuses: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every run, archived ones too (the Run and Compare pages' pickers: a link to an archived run
    opens it); the Runs page's list is :func:`runs_list`."""
    with sessions()() as s:
        return run_list.list_runs(s, list(statuses) or None, where=run_list.RunFilter(archived=True))


@st.cache_data(ttl=1.0, show_spinner=False)
def run_detail(run_id: int) -> dict[str, Any] | None:
    with sessions()() as s:
        try:
            return queries.run_detail(s, run_id)
        except RunNotFound:
            return None


@st.cache_data(ttl=1.0, show_spinner=False)
def metric_keys(run_id: int) -> list[str]:
    with sessions()() as s:
        return queries.metric_keys(s, run_id)


@st.cache_data(ttl=1.0, show_spinner=False)
def event_counts(run_id: int) -> dict[str, int]:
    with sessions()() as s:
        return queries.event_counts(s, run_id)


@st.cache_data(ttl=5.0, show_spinner=False)
def checkpoint_advice(run_id: int) -> dict[str, Any] | None:
    with sessions()() as s:
        try:
            return efficiency.checkpoint_advice(s, run_id)
        except RunNotFound:
            return None


@st.cache_data(ttl=2.0, show_spinner=False)
def run_attempts(run_id: int) -> list[dict[str, Any]]:
    with sessions()() as s:
        return queries.attempts_of(s, run_id)


def lineage_cutoffs(attempts: list[dict[str, Any]]) -> dict[int, float]:
    """Per attempt, the last step still on the run's lineage (see db.run_summary.lineage_cutoffs),
    as the charts show it: an attempt that has not completed a step yet (a retry still starting)
    supersedes nothing yet, so the earlier attempts' curves stay whole until it trains."""
    return run_summary.lineage_cutoffs([a for a in attempts if a["first_step_at"] is not None
                                    or (a["last_step"] or 0) > (a["resume_step"] or 0)])


@st.cache_data(ttl=1.0, show_spinner=False)
def nan_count(run_id: int, cutoffs: dict[int, float]) -> int:
    """The run's NaN points, every metric and rank, along its lineage (db.metricstore.nan_count)."""
    with sessions()() as s:
        return metricstore.nan_count(s, run_id, cutoffs)


def metric_series(run_id: int, key: str, max_points: int, level: int | None = None,
                  since_step: int | None = None) -> Series:
    """One metric of a run from the metric store, downsampled to at most ``max_points`` buckets
    per (attempt, rank) (or at ``level``), only the buckets holding a step >= ``since_step``."""
    with sessions()() as s:
        return series(s, run_id, key, max_points=max_points, level=level, since_step=since_step)


@st.cache_data(ttl=2.0, show_spinner=False)
def metric_series_full(run_id: int, key: str, max_points: int) -> Series:
    """The whole range of one metric (cached briefly: the Compare page and first renders)."""
    return metric_series(run_id, key, max_points)


def validate_config(data: dict[str, Any]) -> RunConfig:
    """Validate a config from the New run page, its files held to :func:`launch_roots`."""
    return validate(data, inventory(), roots=launch_roots(), channels=alert_channels())


def alert_channels() -> ChannelCheck:
    """What judges a config's ``alerts.channels`` against this data folder's channels."""
    return AlertStore(settings().home).config_problems


def submit_run(config: RunConfig) -> int:
    run_id = submit(sessions(), settings(), config, inventory(), channels=alert_channels())
    _changed()
    return run_id


def cancel_run(run_id: int, mode: str = "cancel") -> str:
    with sessions()() as s:
        try:
            message = request_cancel(s, run_id, who="ui", mode=mode)
        except RequestRefused as exc:  # a plain script without a checkpoint source cannot pause
            return str(exc)
        s.commit()
    _changed()
    return message


def _changed() -> None:
    run_detail.clear()
    list_runs.clear()


def dump_stacks(run_id: int) -> str:
    with sessions()() as s:
        try:
            message = request_stack_dump(s, run_id)
        except RequestRefused as exc:
            return str(exc)
        s.commit()
    return message


def resume_run(run_id: int, checkpoint_id: int | None = None) -> str:
    """Queue a finished run to resume from a checkpoint (the newest verified one when None);
    returns a sentence for the person."""
    with sessions()() as s:
        try:
            step = resume_or_promote(s, run_id, "ui", checkpoint_id)  # a PRUNED trial: its promotion
        except RequestRefused as exc:
            return str(exc)
        s.commit()
    _changed()
    return f"Run {run_id} queued to resume from step {step}." if step else f"Run {run_id} queued again from the start."


def rerun_run(run_id: int) -> str:
    """Queue a finished script run again in its folder, without a checkpoint; a sentence."""
    with sessions()() as s:
        try:
            message = request_rerun(s, run_id, who="ui")
        except RequestRefused as exc:
            return str(exc)
        s.commit()
    _changed()
    return message


def pin_checkpoint(run_id: int, checkpoint_id: int, pinned: bool) -> str | None:
    """Pin or unpin; a script's own file is copied first. Returns why it was refused, or None."""
    with sessions()() as s:
        try:
            set_pinned(s, run_id, step=-1, pinned=pinned, checkpoint_id=checkpoint_id)
        except RequestRefused as exc:
            return str(exc)
        s.commit()
    _changed()
    return None


def fork_run(run_id: int, step: int, overrides: list[str], checkpoint_id: int | None = None) -> int:
    """Queue a new run from a checkpoint with changed settings (raises ConfigError, RequestRefused);
    a change of the script, its arguments or the text is held to :func:`launch_roots`."""
    new_id = fork(sessions(), settings(), run_id, step, overrides, inventory(), roots=launch_roots(),
                  checkpoint_id=checkpoint_id, channels=alert_channels())
    _changed()
    return new_id


def fork_source(run_id: int, checkpoint_id: int) -> dict[str, Any]:
    """What a fork of ``run_id`` from ``checkpoint_id`` starts from, for the New run form:
    ``{"run", "name", "checkpoint", "step", "base", "config"}``. ``base`` is the run's config as
    the fork request reads it (its name with ``-fork``); ``config`` adds the changes the scheduler
    made for the attempt that wrote the checkpoint (a halved micro-batch after an out-of-memory),
    the config the run had at that checkpoint.

    Raises:
        RequestRefused: the run or the checkpoint does not exist, or the checkpoint cannot be
            forked from (not verified, or deleted).
    """
    d = run_detail(run_id)
    if d is None:
        raise RequestRefused(f"fork={run_id}: no such run; open Fork… on an existing run's page")
    checkpoint = next((c for c in d["checkpoints"] if c["id"] == checkpoint_id), None)
    if checkpoint is None or not checkpoint["verified"] or checkpoint["deleted"]:
        why = "no such checkpoint" if checkpoint is None else "deleted" if checkpoint["deleted"] else "not verified"
        raise RequestRefused(f"checkpoint={checkpoint_id}: {why} in run {run_id}; choose a verified checkpoint in "
                             "the run page's Fork… menu")
    base = {**d["config"], "name": f"{d['name']}-fork"[:100]}
    attempt = next((a for a in d["attempts"] if a["number"] == checkpoint["attempt"]), None)
    config = deep_merge(base, attempt["overrides"]) if attempt and attempt["overrides"] else base
    return {"run": run_id, "name": d["name"], "checkpoint": checkpoint_id, "step": checkpoint["step"],
            "base": base, "config": config}


def validate_fork(base: dict[str, Any], changed: dict[str, Any]) -> RunConfig:
    """Validate a fork's config as the fork request will: held to :func:`launch_roots` only
    when it changes what runs (the script, its arguments, the text)."""
    return validate(changed, inventory(), roots=launch_roots() if changes_what_runs(base, changed) else None,
                    channels=alert_channels())


def start_estimate(config: dict[str, Any], from_step: int = 0) -> StartEstimate:
    """Time and cost of ``config`` (a run's config as a dict) before it starts at ``from_step``
    (a fork's checkpoint; 0 for a fresh run): this machine's price for its ranks, and the pace of
    the most alike earlier run (db/estimates.py)."""
    with sessions()() as s:
        price = config_price(config.get("launch", {}), config.get("slurm", {}), inventory(), queries.price_table(s))
        return estimates.start_estimate(s, config, price, from_step=from_step)


def prices() -> dict[str, float]:
    with sessions()() as s:
        return queries.price_table(s)


def save_prices(table: dict[str, float]) -> str | None:
    """Save the price table; returns an error message, or None."""
    with sessions()() as s:
        try:
            set_prices(s, table)
        except RequestRefused as exc:
            return str(exc)
        s.commit()
    return None


# -- the Compare page --------------------------------------------------------------------------


@st.cache_data(ttl=2.0, show_spinner=False)
def compare_runs(run_ids: tuple[int, ...]) -> list[dict[str, Any]] | str:
    """Summary and config of each run, in the order given (db.compare.compare_runs); a sentence
    saying which id is no run instead when one is not."""
    with sessions()() as s:
        try:
            return compare.compare_runs(s, run_ids)
        except compare.CompareError as exc:
            return str(exc)


@st.cache_data(ttl=2.0, show_spinner=False)
def metric_summaries(run_ids: tuple[int, ...], keys: tuple[str, ...]) -> dict[tuple[int, str], compare.MetricSummary]:
    """Final and best value of each metric of each run (db.compare.metric_summaries)."""
    with sessions()() as s:
        return compare.metric_summaries(s, run_ids, keys)


# -- the Runs list as a workspace, and a run's name, tags and note (orchestrator/run_edits.py) ----


@st.cache_data(ttl=1.0, show_spinner=False)
def runs_list(statuses: tuple[str, ...] = (), search: str = "", tags: tuple[str, ...] = (), starred: bool = False,
              archived: bool = False, sort: str = "id", descending: bool = True) -> list[dict[str, Any]]:
    """The Runs page's list (db.compare.runs_list): filtered, with its summary metric columns, sorted."""
    where = run_list.RunFilter(statuses=statuses, search=search, tags=tags, starred=starred, archived=archived)
    with sessions()() as s:
        return compare.runs_list(s, where, sort, descending)


@st.cache_data(ttl=5.0, show_spinner=False)
def run_tags() -> list[str]:
    with sessions()() as s:
        return run_list.run_tags(s)


def _edits_changed() -> None:
    _changed()
    runs_list.clear()
    run_tags.clear()
    compare_runs.clear()


def edit_run(run_id: int, *, name: str | None = None, add_tags: tuple[str, ...] = (),
             remove_tags: tuple[str, ...] = (), note: str | None = None) -> tuple[bool, str]:
    """Rename, retag, annotate a run: (done, a sentence saying what changed or why nothing did)."""
    with sessions()() as s:
        try:
            done = run_edits.edit_run(s, run_id, name=name, add_tags=add_tags, remove_tags=remove_tags, note=note,
                                      who="ui")
        except RequestRefused as exc:
            return False, str(exc)
        s.commit()
    _edits_changed()
    return True, (f"Run {run_id}: " + "; ".join(done) + ".") if done else f"Run {run_id}: nothing changed."


def mark_runs(run_ids: list[int], *, starred: bool | None = None, archived: bool | None = None) -> str:
    """Star/unstar or archive/unarchive runs; a sentence per run (a refusal says why)."""
    said = []
    with sessions()() as s:
        for run_id in run_ids:
            try:
                if starred is not None:
                    said.append(run_edits.set_starred(s, run_id, starred, who="ui"))
                if archived is not None:
                    said.append(run_edits.set_archived(s, run_id, archived, who="ui"))
            except RequestRefused as exc:
                said.append(str(exc))
        s.commit()
    _edits_changed()
    return "; ".join(said)


def deletion_plan(run_id: int) -> run_edits.DeletionPlan:
    with sessions()() as s:
        return run_edits.deletion_plan(s, run_id)


def delete_run(run_id: int) -> str:
    """Delete a finished run with its folder; a sentence (what went, or why not)."""
    with sessions()() as s:
        try:
            message = run_edits.delete_run(s, run_id, settings().runs_dir, who="ui")
        except RequestRefused as exc:
            return str(exc)
    _edits_changed()
    return message
