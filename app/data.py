"""The UI's access to the database: one cached engine, cached query results (plain data).

Pages call these functions; they hold no SQL and no ORM objects.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st
from sqlalchemy.orm import Session, sessionmaker

from db import queries
from db.engine import make_engine, make_sessionmaker
from db.requests import RequestRefused, request_cancel, request_resume, request_stack_dump, set_pinned, set_prices
from db.settings import Settings, load_settings
from orchestrator.resources import Inventory, detect_inventory
from orchestrator.submission import fork, submit, validate
from trainer.config import RunConfig


@st.cache_resource
def settings() -> Settings:
    return load_settings()


@st.cache_resource
def sessions() -> sessionmaker[Session]:
    return make_sessionmaker(make_engine(settings().db_url))


@st.cache_resource
def inventory() -> Inventory:
    return detect_inventory()


@st.cache_data(ttl=1.0, show_spinner=False)
def scheduler_status() -> dict[str, Any]:
    with sessions()() as s:
        return queries.scheduler_status(s)


@st.cache_data(ttl=1.0, show_spinner=False)
def list_runs(statuses: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    with sessions()() as s:
        return queries.list_runs(s, list(statuses) or None)


@st.cache_data(ttl=1.0, show_spinner=False)
def run_detail(run_id: int) -> dict[str, Any] | None:
    with sessions()() as s:
        try:
            return queries.run_detail(s, run_id)
        except queries.RunNotFound:
            return None


@st.cache_data(ttl=1.0, show_spinner=False)
def metric_keys(run_id: int) -> list[str]:
    with sessions()() as s:
        return queries.metric_keys(s, run_id)


@st.cache_data(ttl=1.0, show_spinner=False)
def metric_frame(run_id: int, key: str) -> pd.DataFrame:
    with sessions()() as s:
        rows = queries.metric_points(s, run_id, key)
    return pd.DataFrame(rows, columns=["id", "attempt", "rank", "step", "value", "time", "superseded"])


def validate_config(data: dict[str, Any]) -> RunConfig:
    return validate(data, inventory())


def submit_run(config: RunConfig) -> int:
    run_id = submit(sessions(), settings(), config, inventory())
    _changed()
    return run_id


def cancel_run(run_id: int, mode: str = "cancel") -> str:
    with sessions()() as s:
        message = request_cancel(s, run_id, who="ui", mode=mode)
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
            step = request_resume(s, run_id, who="ui", checkpoint_id=checkpoint_id)
        except RequestRefused as exc:
            return str(exc)
        s.commit()
    _changed()
    return f"Run {run_id} queued to resume from step {step}."


def pin_checkpoint(run_id: int, checkpoint_id: int, pinned: bool) -> None:
    with sessions()() as s:
        set_pinned(s, run_id, step=-1, pinned=pinned, checkpoint_id=checkpoint_id)
        s.commit()
    _changed()


def fork_run(run_id: int, step: int, overrides: list[str]) -> int:
    """Queue a new run from a checkpoint with changed settings (raises ConfigError, RequestRefused)."""
    new_id = fork(sessions(), settings(), run_id, step, overrides, inventory())
    _changed()
    return new_id


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
