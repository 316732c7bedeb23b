"""sweeps: a sweep, its status history and its trials (issue 54)

A sweep searches a base config; each trial is an ordinary run, with the sweep's record of it
beside (db/models.py: ``Sweep``, ``SweepStatusHistory``, ``SweepTrial``). Only new tables: no row
of the first release changes, and a database downgraded loses the sweeps alone (their trials stay
as runs). The run status ``PRUNED`` needs no change of the schema (``runs.status`` is text).

Revision ID: r002
Revises: r001
Create Date: 2027-01-12 10:00:00.000000
"""
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = 'r002'
down_revision = 'r001'
branch_labels = None
depends_on = None


# (column, type, nullable) of each new table, in the order of db/models.py.
SWEEPS = [('id', sa.Integer(), False), ('name', sa.String(length=100), False),
          ('status', sa.String(length=16), False), ('status_reason', sa.Text(), True),
          ('base_json', sa.Text(), False), ('sweep_json', sa.Text(), False), ('seed', sa.BigInteger(), False),
          ('max_trials', sa.Integer(), False), ('max_concurrent', sa.Integer(), False),
          ('rungs_json', sa.Text(), False),
          ('created_at', sa.Float(), False), ('updated_at', sa.Float(), False), ('ended_at', sa.Float(), True)]
HISTORY = [('id', sa.Integer(), False), ('sweep_id', sa.Integer(), False), ('from_status', sa.String(length=16), True),
           ('to_status', sa.String(length=16), False), ('reason', sa.Text(), False), ('at', sa.Float(), False)]
TRIALS = [('id', sa.Integer(), False), ('sweep_id', sa.Integer(), False), ('number', sa.Integer(), False),
          ('run_id', sa.Integer(), True), ('params_json', sa.Text(), False), ('history_json', sa.Text(), False),
          ('error', sa.Text(), True), ('rung', sa.Integer(), True), ('rungs_json', sa.Text(), False),
          ('objective', sa.Float(), True), ('objective_step', sa.Integer(), True), ('prune_json', sa.Text(), True),
          ('promoted', sa.Integer(), False), ('created_at', sa.Float(), False)]


def _columns(spec: list[tuple[str, Any, bool]]) -> list[sa.Column[Any]]:
    return [sa.Column(name, kind, nullable=nullable) for name, kind, nullable in spec]


def upgrade() -> None:
    op.create_table('sweeps', *_columns(SWEEPS), sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_sweeps_status', 'sweeps', ['status'])
    op.create_table('sweep_status_history', *_columns(HISTORY), sa.PrimaryKeyConstraint('id'),
                    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'))
    op.create_index('ix_sweep_status_history_sweep_id', 'sweep_status_history', ['sweep_id'])
    op.create_table('sweep_trials', *_columns(TRIALS), sa.PrimaryKeyConstraint('id'),
                    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
                    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='SET NULL'),
                    sa.UniqueConstraint('sweep_id', 'number'), sa.UniqueConstraint('run_id'))
    op.create_index('ix_sweep_trials_sweep_id', 'sweep_trials', ['sweep_id'])


def downgrade() -> None:
    for table in ('sweep_trials', 'sweep_status_history', 'sweeps'):
        op.drop_table(table)
