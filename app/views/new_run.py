"""New run: the run config as a form (or a TOML upload), validated before anything is queued."""

from __future__ import annotations

import shlex
from typing import Any

import streamlit as st

from app import data
from db.config import ConfigError, RunConfig, deep_merge, field_of, parse_toml

st.title("New run")

uploaded = st.file_uploader("Start from a TOML config (optional)", type=["toml"])
base: dict[str, Any] = RunConfig().as_dict()
if uploaded is not None:
    try:
        raw = parse_toml(uploaded.getvalue().decode())
        base = {**base, **{k: ({**base.get(k, {}), **v} if isinstance(v, dict) else v) for k, v in raw.items()}}
        st.caption(f"Form filled from {uploaded.name}; change anything before starting.")
    except (ConfigError, UnicodeDecodeError) as exc:
        st.error(f"{uploaded.name}: {exc}")

errors: dict[str, list[str]] = st.session_state.get("new_run_errors", {})


def field_errors(field: str) -> None:
    for message in errors.get(field, []):
        st.error(message, icon=":material/error:")


with st.form("new_run"):
    name = st.text_input("Name", value=str(base.get("name", "run")), key="name")
    field_errors("name")
    tags = st.text_input("Tags (comma separated)", value=", ".join(base.get("tags", [])), key="tags")
    c1, c2 = st.columns(2)
    with c1:
        st.subheader("Workload")
        kinds = ["mlp-digits", "gpt-char", "script"]
        kind = st.selectbox("Workload", kinds, index=kinds.index(base["workload"].get("kind", "mlp-digits")),
                            key="workload.kind", help="Built-in workloads, or your own torchrun script")
        field_errors("workload.kind")
        field_errors("workload")
        hidden = st.number_input("Hidden width (mlp-digits)", value=int(base["workload"].get("hidden", 256)), step=32, key="workload.hidden")
        field_errors("workload.hidden")
        script = st.text_input("Script (kind = script)", value=base["workload"].get("script") or "",
                               placeholder="path/to/train.py", key="workload.script")
        field_errors("workload.script")
        script_args = st.text_input("Script arguments", value=shlex.join(base["workload"].get("args") or []),
                                    key="workload.args")
        st.subheader("Launch")
        nproc = st.number_input("Ranks on this machine (nproc_per_node)", value=int(base["launch"]["nproc_per_node"]), step=1, key="launch.nproc_per_node")
        field_errors("launch.nproc_per_node")
        backend_options = ["auto", "gloo", "nccl"]
        backend = st.selectbox("Backend", backend_options, index=backend_options.index(base["launch"].get("backend", "auto")), key="launch.backend")
        field_errors("launch.backend")
    with c2:
        st.subheader("Training")
        t = base["train"]
        max_steps = st.number_input("Max steps", value=int(t["max_steps"]), step=100, key="train.max_steps")
        field_errors("train.max_steps")
        batch_size = st.number_input("Batch size per rank", value=int(t["batch_size"]), step=16, key="train.batch_size")
        field_errors("train.batch_size")
        lr = st.number_input("Learning rate", value=float(t["lr"]), format="%.6f", step=0.0001, key="train.lr")
        field_errors("train.lr")
        seed = st.number_input("Seed", value=int(t["seed"]), step=1, key="train.seed")
        field_errors("train.seed")
        log_every = st.number_input("Log every (steps)", value=int(t["log_every"]), step=1, key="train.log_every")
        field_errors("train.log_every")
        eval_every = st.number_input("Evaluate every (steps, 0 = only at the end)", value=int(t["eval_every"]), step=10, key="train.eval_every")
        field_errors("train.eval_every")
        deterministic = st.checkbox("Deterministic (bit-identical resume)", value=bool(t.get("deterministic", False)), key="train.deterministic")
    with st.expander("Retries and supervision"):
        r, sv = base["retry"], base["supervision"]
        s1, s2 = st.columns(2)
        max_retries = s1.number_input("Max retries", value=int(r["max_retries"]), step=1, key="retry.max_retries")
        backoff_s = s1.number_input("First backoff (s)", value=float(r["backoff_s"]), step=1.0, key="retry.backoff_s")
        hang_timeout_s = s2.number_input("Hang timeout (s)", value=float(sv["hang_timeout_s"]), step=30.0, key="supervision.hang_timeout_s")
        grace_s = s2.number_input("Grace on stop (s)", value=float(sv["grace_s"]), step=5.0, key="supervision.grace_s")
        for f in ("retry.max_retries", "retry.backoff_s", "supervision.hang_timeout_s", "supervision.grace_s"):
            field_errors(f)
    with st.expander("Checkpoints"):
        ck = base["checkpoint"]
        k1, k2, k3 = st.columns(3)
        every_steps = k1.number_input("Save every (steps, 0 = off)", value=int(ck["every_steps"]), step=50, key="checkpoint.every_steps")
        every_seconds = k1.number_input("Save every (seconds, 0 = off)", value=float(ck["every_seconds"]), step=60.0, key="checkpoint.every_seconds")
        keep_last = k2.number_input("Keep last (0 = all)", value=int(ck["keep_last"]), step=1, key="checkpoint.keep_last")
        keep_best = k2.number_input("Keep best", value=int(ck["keep_best"]), step=1, key="checkpoint.keep_best")
        best_metric = k3.text_input("Best by metric", value=str(ck["best_metric"]), key="checkpoint.best_metric")
        best_mode = k3.selectbox("Better is", ["min", "max"], index=["min", "max"].index(ck["best_mode"]), key="checkpoint.best_mode")
        async_save = k3.checkbox("Write in the background", value=bool(ck["async"]), key="checkpoint.async")
        for f in ("every_steps", "every_seconds", "keep_last", "keep_best", "best_metric", "best_mode", "async"):
            field_errors(f"checkpoint.{f}")
    started = st.form_submit_button("Start", type="primary", icon=":material/play_arrow:")

for message in errors.get("", []):
    st.error(message)

if started:
    form = {
        "name": name.strip(),
        "tags": [t.strip() for t in tags.split(",") if t.strip()],
        "workload": {"kind": kind, "hidden": int(hidden), "script": script.strip() or None,
                     "args": shlex.split(script_args) if kind == "script" else []},
        "retry": {"max_retries": int(max_retries), "backoff_s": float(backoff_s)},
        "supervision": {"hang_timeout_s": float(hang_timeout_s), "grace_s": float(grace_s)},
        "launch": {"nproc_per_node": int(nproc), "backend": backend},
        "train": {
            "max_steps": int(max_steps), "batch_size": int(batch_size), "lr": float(lr), "seed": int(seed),
            "log_every": int(log_every), "eval_every": int(eval_every), "deterministic": bool(deterministic),
        },
        "checkpoint": {
            "every_steps": int(every_steps), "every_seconds": float(every_seconds), "keep_last": int(keep_last),
            "keep_best": int(keep_best), "best_metric": best_metric.strip(), "best_mode": best_mode, "async": bool(async_save),
        },
    }
    if kind != "script":
        form["workload"]["script"] = None
    # Keys the form does not show (from an uploaded TOML) are kept.
    config_data = deep_merge(base, form)
    try:
        config = data.validate_config(config_data)
    except ConfigError as exc:
        form_fields = {"name", "tags", "workload", "workload.kind", "workload.hidden", "workload.script",
                       "launch.nproc_per_node", "launch.backend", "retry.max_retries", "retry.backoff_s",
                       "supervision.hang_timeout_s", "supervision.grace_s",
                       "train.max_steps", "train.batch_size", "train.lr", "train.seed", "train.log_every", "train.eval_every",
                       "checkpoint.every_steps", "checkpoint.every_seconds", "checkpoint.keep_last", "checkpoint.keep_best",
                       "checkpoint.best_metric", "checkpoint.best_mode", "checkpoint.async"}
        grouped: dict[str, list[str]] = {}
        for problem in exc.problems:
            field = field_of(problem)
            grouped.setdefault(field if field in form_fields else "", []).append(problem)
        st.session_state["new_run_errors"] = grouped
        st.rerun()
    st.session_state["new_run_errors"] = {}
    run_id = data.submit_run(config)
    st.switch_page("views/run.py", query_params={"run": str(run_id)})
