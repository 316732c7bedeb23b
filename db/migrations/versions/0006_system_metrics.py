"""system metrics

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 10:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
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


def downgrade() -> None:
    op.drop_index('ix_system_metrics_host_device_at', table_name='system_metrics')
    op.drop_index('ix_system_metrics_run_at', table_name='system_metrics')
    op.drop_table('system_metrics')
