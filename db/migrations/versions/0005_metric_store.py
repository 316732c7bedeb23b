"""metric store: metric names, raw points keyed by (run, name, attempt, step, rank), rollups

The ``metrics`` table (one row per point, the name as a string) becomes three tables:
``metric_names``, ``metric_points`` (clustered on its key on SQLite) and ``metric_rollups``
(buckets of 4**level steps for levels 1..10, see db/metricstore.py for the rules). Existing
points are copied (when the same point was recorded twice, the first one is kept, as the store
does) and their rollups computed here in SQL, so that this migration does not depend on code that
may change later. ``metrics`` survives as a read-only view with its old columns (minus ``id``)
for ad-hoc SQL. A later batch-mode ALTER of ``metric_points`` or ``metric_names`` on SQLite
must drop and re-create that view around it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 10:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

# Frozen copies of db/metricstore.py's constants as of this revision.
LEVELS = 10
BASE = 4

VIEW = """
CREATE VIEW metrics AS
SELECT p.run_id AS run_id, p.attempt AS attempt, p.rank AS rank, p.step AS step, n.name AS key,
       p.value AS value, p.wall_time AS wall_time
FROM metric_points p JOIN metric_names n ON n.id = p.name_id
"""

_SAME_SERIES = (
    "p.run_id = metric_rollups.run_id AND p.name_id = metric_rollups.name_id "
    "AND p.attempt = metric_rollups.attempt AND p.rank = metric_rollups.rank"
)


def _create_tables() -> None:
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
    sa.ForeignKeyConstraint(['name_id'], ['metric_names.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
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
    sa.ForeignKeyConstraint(['name_id'], ['metric_names.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'name_id', 'level', 'attempt', 'bucket', 'rank'),
    sqlite_with_rowid=False
    )


def _copy_points() -> None:
    op.execute("INSERT INTO metric_names (name) SELECT DISTINCT key FROM metrics ORDER BY key")
    op.execute(
        "INSERT INTO metric_points (run_id, name_id, attempt, step, rank, value, wall_time) "
        "SELECT m.run_id, n.id, m.attempt, m.step, m.rank, m.value, m.wall_time "
        "FROM metrics m JOIN metric_names n ON n.name = m.key "
        "WHERE m.id IN (SELECT min(id) FROM metrics GROUP BY run_id, key, attempt, rank, step)"
    )


def _build_rollups() -> None:
    for level in range(1, LEVELS + 1):
        size = BASE ** level
        # NULL value = NaN: min, max and sum skip it, count(value) counts the others. A sum of
        # +Inf and -Inf is NULL (NaN); a sum over no values is 0 so that later points add to it.
        op.execute(
            "INSERT INTO metric_rollups (run_id, name_id, level, attempt, bucket, rank, min_value, max_value, "
            "sum_value, count, nan_count, first_step, last_step, first_time, last_time, last_value) "
            f"SELECT run_id, name_id, {level}, attempt, step / {size}, rank, min(value), max(value), "
            "CASE WHEN count(value) = 0 THEN 0.0 ELSE sum(value) END, count(*), count(*) - count(value), "
            "min(step), max(step), 0.0, 0.0, NULL "
            f"FROM metric_points GROUP BY run_id, name_id, attempt, step / {size}, rank"
        )
    op.execute(
        "UPDATE metric_rollups SET "
        f"first_time = (SELECT p.wall_time FROM metric_points p WHERE {_SAME_SERIES} "
        "AND p.step = metric_rollups.first_step), "
        f"last_time = (SELECT p.wall_time FROM metric_points p WHERE {_SAME_SERIES} "
        "AND p.step = metric_rollups.last_step), "
        f"last_value = (SELECT p.value FROM metric_points p WHERE {_SAME_SERIES} "
        "AND p.step = metric_rollups.last_step)"
    )


def upgrade() -> None:
    _create_tables()
    _copy_points()
    _build_rollups()
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.drop_index('ix_metrics_run_key_step')
    op.drop_table('metrics')
    op.execute(VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW metrics")
    op.create_table('metrics',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=100), nullable=False),
    sa.Column('value', sa.Float(), nullable=True),
    sa.Column('wall_time', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.create_index('ix_metrics_run_key_step', ['run_id', 'key', 'step', 'rank', 'value'], unique=False)
    op.execute(
        "INSERT INTO metrics (run_id, attempt, rank, step, key, value, wall_time) "
        "SELECT p.run_id, p.attempt, p.rank, p.step, n.name, p.value, p.wall_time "
        "FROM metric_points p JOIN metric_names n ON n.id = p.name_id "
        "ORDER BY p.wall_time, p.run_id, p.attempt, p.step, p.rank, n.name"
    )
    op.drop_table('metric_rollups')
    op.drop_table('metric_points')
    op.drop_table('metric_names')
