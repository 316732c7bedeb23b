"""SQLAlchemy 2.x typed models. Times are UNIX epoch seconds (float) so that durations, ETA and
cost are plain arithmetic; the UI converts them to the person's clock."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


# Where a constraint exists only on some databases: Constraint.info[DIALECTS] names them.
DIALECTS = "runyard.dialects"


def held_on(item: object, dialect: str) -> bool:
    """Whether the database ``dialect`` (``"sqlite"``, ``"postgresql"``) holds the schema item
    ``item``; every item does, except those made by :func:`sqlite_only_key`."""
    info = getattr(item, "info", None) or {}
    return dialect in info.get(DIALECTS, (dialect,))


def include_object(dialect: str) -> Callable[[object, str | None, str, bool, object], bool]:
    """Alembic's ``include_object`` hook for comparing a ``dialect`` database with these models:
    an item of the models that the dialect does not hold is not expected there (reflected items
    are always compared)."""
    def include(item: object, _name: str | None, _type: str, reflected: bool, _compare_to: object) -> bool:
        return reflected or held_on(item, dialect)

    return include


def sqlite_only_key(column: str, referred: str, ondelete: str | None = None) -> ForeignKeyConstraint:
    """A foreign key that SQLite holds and PostgreSQL does not (the initial migration): CREATE TABLE
    leaves it out on PostgreSQL, and the comparison of the migrated schema with these models
    (tests/unit/db/test_engine_migrations.py, autogenerate in db/migrations/env.py) expects it absent there."""
    key = ForeignKeyConstraint([column], [referred], ondelete=ondelete, info={DIALECTS: ("sqlite",)})
    return key.ddl_if(dialect="sqlite")


def _metric_keys() -> tuple[ForeignKeyConstraint, ForeignKeyConstraint]:
    """The run and name keys of metric_points and metric_rollups: SQLite only.

    PostgreSQL checks a foreign key with a trigger per row written (a ``SELECT ... FOR KEY
    SHARE`` on the run and on the name), which made its ingest four to seven times slower than
    SQLite's (docs/benchmarks-journal.md, "PostgreSQL beside SQLite"). These rows are written only
    by a run's own rank 0, under its run id and name ids it has just resolved, and that writer
    checks both once a batch (db/metricstore/bulk.py); deleting a run deletes its rows through a trigger
    on ``runs`` (the initial migration). SQLite keeps the keys (its writer connection skips
    checking them).
    """
    return (sqlite_only_key("run_id", "runs.id", ondelete="CASCADE"),
            sqlite_only_key("name_id", "metric_names.id"))


class Stateful:
    """A row with a state machine of its own (a run, a sweep): its id, its name, its status and
    why; its transitions write the status only where it is still the one read (db/states.py's
    ``moved``)."""

    # sort_order: first in each table, where the migrations put them.
    id: Mapped[int] = mapped_column(Integer, primary_key=True, sort_order=-1)
    name: Mapped[str] = mapped_column(String(100), sort_order=-1)
    status: Mapped[str] = mapped_column(String(16), index=True, sort_order=-1)
    status_reason: Mapped[str | None] = mapped_column(Text, sort_order=-1)


class Run(Stateful, Base):
    """One training run; its current status plus what the scheduler needs to launch it."""

    __tablename__ = "runs"

    config_json: Mapped[str] = mapped_column(Text)
    config_hash: Mapped[str] = mapped_column(String(64))
    tags_json: Mapped[str] = mapped_column(Text, default="[]")
    max_steps: Mapped[int] = mapped_column(Integer)
    nproc: Mapped[int] = mapped_column(Integer)  # every rank, on every node
    executor: Mapped[str] = mapped_column(String(16), default="local", server_default="local")  # launch.executor
    run_dir: Mapped[str] = mapped_column(Text, default="")
    price_usd_per_hour: Mapped[float] = mapped_column(Float, default=0.0)
    price_unit: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    # A fork starts from a checkpoint of its parent run.
    parent_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL", name="fk_runs_parent_run_id_runs")
    )
    parent_step: Mapped[int | None] = mapped_column(Integer)
    parent_checkpoint_id: Mapped[int | None] = mapped_column(
        ForeignKey("checkpoints.id", ondelete="SET NULL", use_alter=True, name="fk_runs_parent_checkpoint")
    )
    retries_used: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    retry_at: Mapped[float | None] = mapped_column(Float)  # while RETRYING: when the next attempt starts
    stop_mode: Mapped[str | None] = mapped_column(String(16))  # "cancel" or "pause" while CANCELLING
    dump_requested_at: Mapped[float | None] = mapped_column(Float)  # "Dump stacks" request
    # A pending resume request: the next attempt starts from this checkpoint.
    resume_checkpoint_id: Mapped[int | None] = mapped_column(
        ForeignKey("checkpoints.id", ondelete="SET NULL", use_alter=True, name="fk_runs_resume_checkpoint")
    )
    # A pending rerun request (`runyard rerun`): the next attempt starts without a checkpoint.
    start_fresh: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # What a person keeps about the run after submit (orchestrator/run_edits.py): a star, the
    # archive mark (hidden from the Runs list and `runyard ls` unless asked for), a free-text note.
    starred: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    archived: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    note: Mapped[str | None] = mapped_column(Text)

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="run", order_by="Attempt.number", cascade="all, delete-orphan"
    )


class StatusChange:
    """A status history row's change (a run's, a sweep's): from what, to what, why, when."""

    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[float] = mapped_column(Float)


class RunStatusHistory(StatusChange, Base):
    """Every status change of a run, with the reason: the audit trail beside the current state."""

    __tablename__ = "run_status_history"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)


class Attempt(Base):
    """One torchrun launch of a run."""

    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("run_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    dir: Mapped[str] = mapped_column(Text)
    pid: Mapped[int | None] = mapped_column(Integer)
    pid_create_time: Mapped[float | None] = mapped_column(Float)
    port: Mapped[int | None] = mapped_column(Integer)
    devices_json: Mapped[str] = mapped_column(Text, default="[]")
    device_kind: Mapped[str] = mapped_column(String(64), default="cpu")
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[float] = mapped_column(Float)
    first_step_at: Mapped[float | None] = mapped_column(Float)
    progress_at: Mapped[float | None] = mapped_column(Float)
    last_step: Mapped[int | None] = mapped_column(Integer)
    phase: Mapped[str | None] = mapped_column(String(16))  # "finishing" after the last step (final save, teardown)
    # When each start-up phase ended, as rank 0 saw it: {"spawned": t, "imported": t, "joined": t,
    # "data": t, "checkpoint": t} (wall-clock seconds; db/vocabulary/phases.py turns them into durations).
    phase_marks_json: Mapped[str | None] = mapped_column(Text)
    # Where this attempt started from: a checkpoint folder (this run's or a fork parent's) and step.
    resume_dir: Mapped[str | None] = mapped_column(Text)
    resume_step: Mapped[int | None] = mapped_column(Integer)
    resume_path: Mapped[str | None] = mapped_column(Text)  # a script's own checkpoint file it started from
    # What the hang watchdog watches: "steps" (reported steps), "output" (a plain script's output
    # and event files); None while nothing can be watched yet.
    watching: Mapped[str | None] = mapped_column(String(32))
    signal_sent: Mapped[str | None] = mapped_column(String(16))
    signal_sent_at: Mapped[float | None] = mapped_column(Float)
    stop_reason: Mapped[str | None] = mapped_column(String(16))  # why runyard stopped it: cancel, pause, hang
    ended_at: Mapped[float | None] = mapped_column(Float)
    # Set per attempt (e.g. half the micro-batch after a CUDA OOM), merged into the run config.
    overrides_json: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")
    # How it failed, for the timeline.
    cause: Mapped[str | None] = mapped_column(String(24))
    failed_rank: Mapped[int | None] = mapped_column(Integer)
    exception: Mapped[str | None] = mapped_column(Text)
    log_tail: Mapped[str | None] = mapped_column(Text)
    last_checkpoint_step: Mapped[int | None] = mapped_column(Integer)
    steps_lost: Mapped[int | None] = mapped_column(Integer)
    failed_at: Mapped[float | None] = mapped_column(Float)
    detected_at: Mapped[float | None] = mapped_column(Float)
    hang_detected_at: Mapped[float | None] = mapped_column(Float)
    retry_counted: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    # The scheduler that launched it and supervises it (``scheduler_heartbeat.id``; no foreign key:
    # heartbeat rows may be deleted by hand). Another scheduler takes it over only once that
    # scheduler's lease has expired (db/lease.py). NULL for attempts from before leases.
    scheduler_id: Mapped[int | None] = mapped_column(Integer, index=True)
    # Where it runs (launch.executor): "local" (pid above) or "slurm" (the job below). Slurm's own
    # view of the job, as the scheduler last read it (squeue, sacct): its state (PENDING,
    # RUNNING, ... or UNKNOWN when it left the queue unaccounted for), the reason it pends
    # (Resources, Priority), its nodes, and when that was read.
    executor: Mapped[str] = mapped_column(String(16), default="local", server_default="local")
    job_id: Mapped[str | None] = mapped_column(String(64))
    job_state: Mapped[str | None] = mapped_column(String(32))
    job_reason: Mapped[str | None] = mapped_column(Text)
    job_nodes: Mapped[str | None] = mapped_column(Text)
    job_state_at: Mapped[float | None] = mapped_column(Float)

    run: Mapped[Run] = relationship(back_populates="attempts")


class MetricName(Base):
    """A metric's name ("loss"), stored once; points and rollups refer to it by id."""

    __tablename__ = "metric_names"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)


class MetricPoint(Base):
    """One reported value: per run, metric, attempt, step and rank (see db/metricstore/).

    NULL ``value`` means NaN (SQLite cannot store a NaN); an infinity is stored as such. On
    SQLite the table is clustered on its primary key: a chart reads one contiguous range, and a
    batch appends to one place per metric (the ranks of a step sit together). The keys to
    ``runs`` and ``metric_names`` are SQLite's only (see :func:`_metric_keys`).
    """

    __tablename__ = "metric_points"
    __table_args__ = (*_metric_keys(), {"sqlite_with_rowid": False})

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[float | None] = mapped_column(Float)
    wall_time: Mapped[float] = mapped_column(Float)


class MetricRollup(Base):
    """The points of one (run, metric, attempt, rank) in buckets of ``4**level`` steps
    (``bucket = step // 4**level``), kept up to date as points arrive (see db/metricstore/).

    ``min_value``, ``max_value`` and ``sum_value`` are over the non-NaN values (``min`` and
    ``max`` NULL when every value is NaN; ``sum`` NULL when it is NaN, i.e. +Inf and -Inf met);
    ``count`` counts every point and ``nan_count`` the NaN ones. ``last_value`` (NULL: NaN) and
    ``last_time`` belong to the point at ``last_step``, ``first_time`` to the one at
    ``first_step``. Clustered on the primary key on SQLite: one level of one metric is one
    contiguous range. The keys to ``runs`` and ``metric_names`` are SQLite's only, as for
    :class:`MetricPoint`.
    """

    __tablename__ = "metric_rollups"
    __table_args__ = (*_metric_keys(), {"sqlite_with_rowid": False})

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    min_value: Mapped[float | None] = mapped_column(Float)
    max_value: Mapped[float | None] = mapped_column(Float)
    sum_value: Mapped[float | None] = mapped_column(Float)
    count: Mapped[int] = mapped_column(Integer)
    nan_count: Mapped[int] = mapped_column(Integer)
    first_step: Mapped[int] = mapped_column(Integer)
    last_step: Mapped[int] = mapped_column(Integer)
    first_time: Mapped[float] = mapped_column(Float)
    last_time: Mapped[float] = mapped_column(Float)
    last_value: Mapped[float | None] = mapped_column(Float)


class Checkpoint(Base):
    """One checkpoint written by rank 0; deleted ones stay as history."""

    __tablename__ = "checkpoints"
    __table_args__ = (Index("ix_checkpoints_run_step", "run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    bytes: Mapped[int] = mapped_column(BigInteger)  # checkpoints pass 2 GiB: PostgreSQL's INTEGER does not
    sha256: Mapped[str] = mapped_column(String(64))  # of the manifest
    params_digest: Mapped[str] = mapped_column(String(64))
    metrics_json: Mapped[str] = mapped_column(Text, default="{}")
    blocked_s: Mapped[float] = mapped_column(Float)
    total_s: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    verified: Mapped[bool] = mapped_column(Boolean, default=True)
    refused_reason: Mapped[str | None] = mapped_column(Text)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)
    deleted_at: Mapped[float | None] = mapped_column(Float)
    deleted_reason: Mapped[str | None] = mapped_column(Text)
    # "runyard": written through runyard (the built-in workloads, the SDK), ``path`` its manifest;
    # "script": a file the script wrote itself (workload.checkpoint_glob, or adopted through the
    # SDK's ``adopt_checkpoint``): ``origin`` the file the script wrote, ``path`` where this
    # version's bytes are now (``origin`` itself, or its copy in the run's folder once pinned),
    # ``bytes``, ``sha256`` and ``file_mtime`` that version's size, contents' hash and
    # modification time. A file rewritten in place is a new row; the one it replaced is deleted.
    source: Mapped[str] = mapped_column(String(16), default="runyard", server_default="runyard")
    file_mtime: Mapped[float | None] = mapped_column(Float)
    origin: Mapped[str | None] = mapped_column(Text)


class Event(Base):
    """Something a person should know about a run: launch, exit, cancel, warnings."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int | None] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)
    level: Mapped[str] = mapped_column(String(8), default="info")
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)


class SchedulerHeartbeat(Base):
    """One row per scheduler process; the UI says "scheduler offline" when the newest is stale.

    It is also the scheduler's lease on the attempts it launched (db/lease.py): a row whose
    ``beat_at`` is older than the lease is a scheduler presumed dead."""

    __tablename__ = "scheduler_heartbeat"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    beat_at: Mapped[float] = mapped_column(Float)
    home: Mapped[str | None] = mapped_column(Text)  # its data folder (NULL in rows from before leases)


class PriceEntry(Base):
    """The price table (USD per hour) edited on the Settings page; a run keeps the price it was
    submitted with. ``device`` is a GPU model name (matched as a substring of what NVML
    reports) or ``cpu-node`` (a whole CPU machine)."""

    __tablename__ = "prices"

    device: Mapped[str] = mapped_column(String(64), primary_key=True)
    usd_per_hour: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class PanelLayout(Base):
    """How one person arranged the Run page's charts (issue 56 item 7; db/workspace/layouts.py): the
    curves pinned on the Overview, the Metrics sections opened or closed, the chart open full width,
    as JSON. ``person`` is who the UI knows (the proxy's user, the single sign-on's e-mail, else the
    data folder's owner); ``scope`` what the layout holds for (``runs``: every run)."""

    __tablename__ = "panel_layouts"

    person: Mapped[str] = mapped_column(String(255), primary_key=True)
    scope: Mapped[str] = mapped_column(String(64), primary_key=True)
    layout_json: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)


class SystemMetric(Base):
    """One 10-s aggregate of a system sample series, written by the scheduler's monitor.

    ``device`` is ``host`` (CPU, memory, disk, network of the machine), ``gpu<N>`` (NVML index)
    or ``procs`` (a run's processes: the whole tree when ``rank`` is null, else one rank's).
    ``run_id`` and ``rank`` say which run (and rank) a GPU or process series belongs to; null
    for the host and for GPUs no run holds. ``at`` is the start of the 10-s window."""

    __tablename__ = "system_metrics"
    __table_args__ = (
        Index("ix_system_metrics_run_at", "run_id", "at"),
        Index("ix_system_metrics_host_device_at", "host", "device", "at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float)
    host: Mapped[str] = mapped_column(String(255))
    device: Mapped[str] = mapped_column(String(32))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int | None] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(64))
    min: Mapped[float] = mapped_column(Float)
    mean: Mapped[float] = mapped_column(Float)
    max: Mapped[float] = mapped_column(Float)
    count: Mapped[int] = mapped_column(Integer)


class AttemptEnergy(Base):
    """The energy an attempt's device used so far (issue 55; db/energy/, db/vocabulary/energy.py):
    joules, how they were obtained (``method``: measured, estimated, not measured), and the last
    reading (a counter in joules, or a power in watts) that the next one, by any scheduler, goes on from."""

    __tablename__ = "attempt_energy"

    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    device: Mapped[str] = mapped_column(String(32), primary_key=True)  # gpu<N>, rapl:<N>, none
    method: Mapped[str] = mapped_column(String(16))
    joules: Mapped[float] = mapped_column(Float)
    counter: Mapped[float | None] = mapped_column(Float)
    read_at: Mapped[float] = mapped_column(Float)
    uncovered_s: Mapped[float] = mapped_column(Float)  # seconds no reading covered (power x time's gaps)
    note: Mapped[str] = mapped_column(Text)  # the share ("2 of 4 CPU slots"), or why not measured


# -- alerts (issue 28; orchestrator/alerts/) ------------------------------------------------


# An alert's states (see Alert).
ALERT_OPEN, ALERT_RESOLVED, ALERT_CLOSED = "open", "resolved", "closed"


class Alert(Base):
    """One alert: a condition of a run (or of runyard itself) that people were told about.

    ``key`` is unique: ``run:<id>:<trigger>[:<what>]`` (``what``: the attempt for per-attempt
    triggers, the share for budget crossings), ``day:<date>:budget:<share>`` or
    ``scheduler:<heartbeat id>``. ``state`` is ``open`` while the condition holds, ``resolved``
    once it stopped holding (a message says so), ``closed`` when its subject ended without
    resolving (no message). ``sent_at`` is when it was last sent (first fire or a repeat)."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(200), unique=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    trigger: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), index=True)
    message: Mapped[str] = mapped_column(Text)
    opened_at: Mapped[float] = mapped_column(Float)
    sent_at: Mapped[float | None] = mapped_column(Float)
    repeats: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    resolved_at: Mapped[float | None] = mapped_column(Float)


class AlertDelivery(Base):
    """One message to one channel, and its outcome: ``pending`` (queued or between tries, next
    at ``next_at``), ``delivered``, or ``failed`` (every try failed; ``error`` says the last
    one). ``kind``: ``fire``, ``repeat``, ``resolved`` or ``test``. ``channel`` is the channel's
    masked URL, as it was when the message was queued (no secret is stored here)."""

    __tablename__ = "alert_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    alert_id: Mapped[int | None] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    channel_id: Mapped[int] = mapped_column(Integer)
    channel: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(16))
    trigger: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)
    tries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    next_at: Mapped[float] = mapped_column(Float)
    done_at: Mapped[float | None] = mapped_column(Float)


# -- sweeps (issue 54; orchestrator/sweeps/) -------------------------------------------------


class Sweep(Stateful, Base):
    """A sweep: a search over a base config, whose trials are ordinary runs (``sweep_trials``).

    ``status`` is the sweep's own state machine (db/sweeps/states.py). ``base_json`` is the base
    config as validated at start (paths resolved, no ``[sweep]``), ``sweep_json`` its ``[sweep]``
    section as given; ``max_trials`` and ``max_concurrent`` start as the section says and may be
    changed while it runs (the section keeps what was asked). ``rungs_json``: the steps of the
    early stop's rungs, from the base's length and checkpoint cadence, fixed at the start."""

    __tablename__ = "sweeps"

    base_json: Mapped[str] = mapped_column(Text)
    sweep_json: Mapped[str] = mapped_column(Text)
    seed: Mapped[int] = mapped_column(BigInteger)  # up to 2^32 - 1: past PostgreSQL's INTEGER
    max_trials: Mapped[int] = mapped_column(Integer)
    max_concurrent: Mapped[int] = mapped_column(Integer)
    rungs_json: Mapped[str] = mapped_column(Text, default="[]")  # the rungs' steps, ascending (none: no early stop)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)


class SweepStatusHistory(StatusChange, Base):
    """Every status change of a sweep, with the reason (as ``run_status_history`` for runs)."""

    __tablename__ = "sweep_status_history"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)


class SweepTrial(Base):
    """One trial of a sweep: its number (unique in the sweep, so no two schedulers create the
    same trial), its run (its state is the run's status, never a copy) and what the sweep knows of
    it. ``run_id`` is NULL when the trial's config was refused (``error`` says why; no run was
    made) or its run was deleted.

    ``params_json``: the trial's values by config key. ``history_json``: what the searcher was
    told when it suggested them (``[[number, state, value, {step: value}], ...]``), so that the
    suggestion can be made again and checked. ``rung``: the newest rung judged (NULL: none);
    ``rungs_json``: the objective at each rung judged, ``{"k": [step, value]}`` (value null: not
    recorded by then). ``objective`` and ``objective_step``: the value at the run's end, once it
    SUCCEEDED. ``prune_json``: why it was last stopped early (``{"rung", "step", "value", "cut"}``,
    or ``{"why"}`` for a budget or a breaker). ``promoted``: how many times it was continued after
    a prune."""

    __tablename__ = "sweep_trials"
    __table_args__ = (UniqueConstraint("sweep_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), unique=True)
    params_json: Mapped[str] = mapped_column(Text)
    history_json: Mapped[str] = mapped_column(Text, default="[]")
    error: Mapped[str | None] = mapped_column(Text)
    rung: Mapped[int | None] = mapped_column(Integer)
    rungs_json: Mapped[str] = mapped_column(Text, default="{}")
    objective: Mapped[float | None] = mapped_column(Float)
    objective_step: Mapped[int | None] = mapped_column(Integer)
    prune_json: Mapped[str | None] = mapped_column(Text)
    promoted: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
