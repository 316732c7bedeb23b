"""initial schema: every table, index, key and view of runyard's first release, at once

The fourteen pre-release migrations (0001_initial_schema ... 0014_attempt_phases) squashed into
one, building the same schema on SQLite and on PostgreSQL (compared with SQLAlchemy's inspector,
table by table, when it was written). What differs by database:

- ``metric_points`` and ``metric_rollups`` are clustered on their key on SQLite (``WITHOUT
  ROWID``). SQLite holds their foreign keys to ``runs`` (ON DELETE CASCADE) and ``metric_names``;
  PostgreSQL does not, because it checks a key with one ``SELECT ... FOR KEY SHARE`` per row
  written, most of the server's time on ingest (50k points: 4.6 s with the two keys, 0.75 s
  without them; docs/benchmarks-journal.md, "PostgreSQL beside SQLite"). Their writer, a run's
  own rank 0, checks its batch's runs and names once a batch instead (db/metricstore/bulk.py), and two
  triggers on ``runs`` do what the keys' cascade did: deleting a run deletes its points and
  rollups, and so does TRUNCATE ... CASCADE.
- ``runs`` and ``checkpoints`` refer to each other (a run's fork point and resume point are
  checkpoints, a checkpoint belongs to a run): SQLite takes the keys to a table created later in
  CREATE TABLE; PostgreSQL gets them with ALTER TABLE once ``checkpoints`` exists.

``metrics`` is a read-only view over the points with the name as a string, for ad-hoc SQL. A
later batch-mode ALTER of ``metric_points`` or ``metric_names`` on SQLite must drop and re-create
it around the ALTER.

Revision ID: r001
Revises:
Create Date: 2026-11-28 10:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = 'r001'
down_revision = None
branch_labels = None
depends_on = None

VIEW = """
CREATE VIEW metrics AS
SELECT p.run_id AS run_id, p.attempt AS attempt, p.rank AS rank, p.step AS step, n.name AS key,
       p.value AS value, p.wall_time AS wall_time
FROM metric_points p JOIN metric_names n ON n.id = p.name_id
"""

# Row level, like a foreign key's own cascade: each deleted run's rows go through the primary
# key's index (run_id leads it), never a scan of the whole table.
DELETE_FUNCTION = """
CREATE FUNCTION delete_run_metrics() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM metric_points WHERE run_id = OLD.id;
    DELETE FROM metric_rollups WHERE run_id = OLD.id;
    RETURN NULL;
END;
$$
"""
TRUNCATE_FUNCTION = """
CREATE FUNCTION truncate_run_metrics() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE metric_points, metric_rollups;
    RETURN NULL;
END;
$$
"""

# (name, column) of the keys from runs to checkpoints, both ON DELETE SET NULL.
RUN_CHECKPOINT_KEYS = [
    ('fk_runs_parent_checkpoint', 'parent_checkpoint_id'),
    ('fk_runs_resume_checkpoint', 'resume_checkpoint_id'),
]


def _postgres() -> bool:
    return op.get_bind().dialect.name == 'postgresql'


def _metric_keys() -> list[sa.ForeignKeyConstraint]:
    """The metric tables' keys to runs and metric_names: SQLite's only (see the docstring)."""
    if _postgres():
        return []
    return [sa.ForeignKeyConstraint(['name_id'], ['metric_names.id']),
            sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE')]


def _create_runs() -> None:
    inline_keys = [] if _postgres() else [
        sa.ForeignKeyConstraint([column], ['checkpoints.id'], name=name, ondelete='SET NULL')
        for name, column in RUN_CHECKPOINT_KEYS
    ]
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('status_reason', sa.Text(), nullable=True),
    sa.Column('config_json', sa.Text(), nullable=False),
    sa.Column('config_hash', sa.String(length=64), nullable=False),
    sa.Column('tags_json', sa.Text(), nullable=False),
    sa.Column('max_steps', sa.Integer(), nullable=False),
    sa.Column('nproc', sa.Integer(), nullable=False),
    sa.Column('run_dir', sa.Text(), nullable=False),
    sa.Column('price_usd_per_hour', sa.Float(), nullable=False),
    sa.Column('price_unit', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=True),
    sa.Column('ended_at', sa.Float(), nullable=True),
    sa.Column('parent_run_id', sa.Integer(), nullable=True),
    sa.Column('parent_step', sa.Integer(), nullable=True),
    sa.Column('parent_checkpoint_id', sa.Integer(), nullable=True),
    sa.Column('resume_checkpoint_id', sa.Integer(), nullable=True),
    sa.Column('retries_used', sa.Integer(), nullable=False, server_default='0'),
    sa.Column('retry_at', sa.Float(), nullable=True),
    sa.Column('stop_mode', sa.String(length=16), nullable=True),
    sa.Column('dump_requested_at', sa.Float(), nullable=True),
    sa.Column('start_fresh', sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column('executor', sa.String(length=16), nullable=False, server_default='local'),
    sa.Column('starred', sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column('archived', sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column('note', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.ForeignKeyConstraint(['parent_run_id'], ['runs.id'], name='fk_runs_parent_run_id_runs', ondelete='SET NULL'),
    *inline_keys,
    )
    op.create_index('ix_runs_status', 'runs', ['status'], unique=False)


def _create_checkpoints() -> None:
    op.create_table('checkpoints',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('params_digest', sa.String(length=64), nullable=False),
    sa.Column('metrics_json', sa.Text(), nullable=False),
    sa.Column('blocked_s', sa.Float(), nullable=False),
    sa.Column('total_s', sa.Float(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('verified', sa.Boolean(), nullable=False),
    sa.Column('refused_reason', sa.Text(), nullable=True),
    sa.Column('pinned', sa.Boolean(), nullable=False),
    sa.Column('deleted', sa.Boolean(), nullable=False),
    sa.Column('deleted_at', sa.Float(), nullable=True),
    sa.Column('deleted_reason', sa.Text(), nullable=True),
    sa.Column('source', sa.String(length=16), nullable=False, server_default='runyard'),
    sa.Column('file_mtime', sa.Float(), nullable=True),
    sa.Column('origin', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_checkpoints_run_step', 'checkpoints', ['run_id', 'step'], unique=False)
    if _postgres():
        for name, column in RUN_CHECKPOINT_KEYS:
            op.create_foreign_key(name, 'runs', 'checkpoints', [column], ['id'], ondelete='SET NULL')


def _create_attempts() -> None:
    op.create_table('attempts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('dir', sa.Text(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('pid_create_time', sa.Float(), nullable=True),
    sa.Column('port', sa.Integer(), nullable=True),
    sa.Column('devices_json', sa.Text(), nullable=False),
    sa.Column('device_kind', sa.String(length=64), nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('first_step_at', sa.Float(), nullable=True),
    sa.Column('progress_at', sa.Float(), nullable=True),
    sa.Column('last_step', sa.Integer(), nullable=True),
    sa.Column('signal_sent', sa.String(length=16), nullable=True),
    sa.Column('signal_sent_at', sa.Float(), nullable=True),
    sa.Column('ended_at', sa.Float(), nullable=True),
    sa.Column('resume_dir', sa.Text(), nullable=True),
    sa.Column('resume_step', sa.Integer(), nullable=True),
    sa.Column('stop_reason', sa.String(length=16), nullable=True),
    sa.Column('phase', sa.String(length=16), nullable=True),
    sa.Column('overrides_json', sa.Text(), nullable=False, server_default='{}'),
    sa.Column('cause', sa.String(length=24), nullable=True),
    sa.Column('failed_rank', sa.Integer(), nullable=True),
    sa.Column('exception', sa.Text(), nullable=True),
    sa.Column('log_tail', sa.Text(), nullable=True),
    sa.Column('last_checkpoint_step', sa.Integer(), nullable=True),
    sa.Column('steps_lost', sa.Integer(), nullable=True),
    sa.Column('failed_at', sa.Float(), nullable=True),
    sa.Column('detected_at', sa.Float(), nullable=True),
    sa.Column('hang_detected_at', sa.Float(), nullable=True),
    sa.Column('retry_counted', sa.Boolean(), nullable=False, server_default=sa.true()),
    sa.Column('resume_path', sa.Text(), nullable=True),
    sa.Column('watching', sa.String(length=32), nullable=True),
    sa.Column('scheduler_id', sa.Integer(), nullable=True),
    sa.Column('executor', sa.String(length=16), nullable=False, server_default='local'),
    sa.Column('job_id', sa.String(length=64), nullable=True),
    sa.Column('job_state', sa.String(length=32), nullable=True),
    sa.Column('job_reason', sa.Text(), nullable=True),
    sa.Column('job_nodes', sa.Text(), nullable=True),
    sa.Column('job_state_at', sa.Float(), nullable=True),
    sa.Column('phase_marks_json', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'number')
    )
    op.create_index('ix_attempts_run_id', 'attempts', ['run_id'], unique=False)
    op.create_index('ix_attempts_scheduler_id', 'attempts', ['scheduler_id'], unique=False)


def _create_run_records() -> None:
    """What is recorded about a run beside its attempts: events, status history, system metrics."""
    op.create_table('run_status_history',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('from_status', sa.String(length=16), nullable=True),
    sa.Column('to_status', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_run_status_history_run_id', 'run_status_history', ['run_id'], unique=False)
    op.create_table('events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=True),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('level', sa.String(length=8), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_events_run_id', 'events', ['run_id'], unique=False)
    op.create_table('system_metrics',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('device', sa.String(length=32), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('min', sa.Float(), nullable=False),
    sa.Column('mean', sa.Float(), nullable=False),
    sa.Column('max', sa.Float(), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    # "This run's series since T" and "this host's series since T".
    op.create_index('ix_system_metrics_run_at', 'system_metrics', ['run_id', 'at'], unique=False)
    op.create_index('ix_system_metrics_host_device_at', 'system_metrics', ['host', 'device', 'at'], unique=False)


def _create_metric_store() -> None:
    """Metric names, raw points keyed by (run, name, attempt, step, rank), their rollups
    (db/metricstore/), the ``metrics`` view, and on PostgreSQL the triggers that delete a run's
    points and rollups with it."""
    op.create_table('metric_names',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('metric_points',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('name_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('value', sa.Float(), nullable=True),
    sa.Column('wall_time', sa.Float(), nullable=False),
    *_metric_keys(),
    sa.PrimaryKeyConstraint('run_id', 'name_id', 'attempt', 'step', 'rank'),
    sqlite_with_rowid=False
    )
    op.create_table('metric_rollups',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('name_id', sa.Integer(), nullable=False),
    sa.Column('level', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('bucket', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('min_value', sa.Float(), nullable=True),
    sa.Column('max_value', sa.Float(), nullable=True),
    sa.Column('sum_value', sa.Float(), nullable=True),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.Column('nan_count', sa.Integer(), nullable=False),
    sa.Column('first_step', sa.Integer(), nullable=False),
    sa.Column('last_step', sa.Integer(), nullable=False),
    sa.Column('first_time', sa.Float(), nullable=False),
    sa.Column('last_time', sa.Float(), nullable=False),
    sa.Column('last_value', sa.Float(), nullable=True),
    *_metric_keys(),
    sa.PrimaryKeyConstraint('run_id', 'name_id', 'level', 'attempt', 'bucket', 'rank'),
    sqlite_with_rowid=False
    )
    op.execute(VIEW)
    if _postgres():
        op.execute(DELETE_FUNCTION)
        op.execute("CREATE TRIGGER runs_delete_metrics AFTER DELETE ON runs "
                   "FOR EACH ROW EXECUTE FUNCTION delete_run_metrics()")
        op.execute(TRUNCATE_FUNCTION)
        op.execute("CREATE TRIGGER runs_truncate_metrics AFTER TRUNCATE ON runs "
                   "FOR EACH STATEMENT EXECUTE FUNCTION truncate_run_metrics()")


def _create_alerts() -> None:
    """What runyard told people about runs, and every delivery of it."""
    op.create_table('alerts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('trigger', sa.String(length=16), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('opened_at', sa.Float(), nullable=False),
    sa.Column('sent_at', sa.Float(), nullable=True),
    sa.Column('repeats', sa.Integer(), server_default='0', nullable=False),
    sa.Column('resolved_at', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key')
    )
    op.create_index('ix_alerts_run_id', 'alerts', ['run_id'])
    op.create_index('ix_alerts_state', 'alerts', ['state'])
    op.create_table('alert_deliveries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('alert_id', sa.Integer(), nullable=True),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('channel_id', sa.Integer(), nullable=False),
    sa.Column('channel', sa.Text(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('trigger', sa.String(length=16), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('tries', sa.Integer(), server_default='0', nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('next_at', sa.Float(), nullable=False),
    sa.Column('done_at', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['alert_id'], ['alerts.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_alert_deliveries_alert_id', 'alert_deliveries', ['alert_id'])
    op.create_index('ix_alert_deliveries_run_id', 'alert_deliveries', ['run_id'])
    op.create_index('ix_alert_deliveries_status', 'alert_deliveries', ['status'])


def upgrade() -> None:
    _create_runs()
    op.create_table('scheduler_heartbeat',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('beat_at', sa.Float(), nullable=False),
    sa.Column('home', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('prices',
    sa.Column('device', sa.String(length=64), nullable=False),
    sa.Column('usd_per_hour', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('device')
    )
    _create_attempts()
    _create_checkpoints()
    _create_run_records()
    _create_metric_store()
    _create_alerts()


def downgrade() -> None:
    if _postgres():
        op.execute("DROP TRIGGER runs_truncate_metrics ON runs")
        op.execute("DROP FUNCTION truncate_run_metrics()")
        op.execute("DROP TRIGGER runs_delete_metrics ON runs")
        op.execute("DROP FUNCTION delete_run_metrics()")
        for name, _column in RUN_CHECKPOINT_KEYS:  # the cycle between runs and checkpoints
            op.drop_constraint(name, 'runs', type_='foreignkey')
    op.execute("DROP VIEW metrics")
    for table in ('alert_deliveries', 'alerts', 'metric_rollups', 'metric_points', 'metric_names', 'system_metrics',
                  'events', 'run_status_history', 'checkpoints', 'attempts', 'prices', 'scheduler_heartbeat', 'runs'):
        op.drop_table(table)
