"""alerts: what runyard told people about runs, and every delivery of it (issue 28)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 05:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'alerts',
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
        sa.UniqueConstraint('key'),
    )
    op.create_index('ix_alerts_run_id', 'alerts', ['run_id'])
    op.create_index('ix_alerts_state', 'alerts', ['state'])
    op.create_table(
        'alert_deliveries',
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
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'],
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_alert_deliveries_alert_id', 'alert_deliveries', ['alert_id'])
    op.create_index('ix_alert_deliveries_run_id', 'alert_deliveries', ['run_id'])
    op.create_index('ix_alert_deliveries_status', 'alert_deliveries', ['status'])


def downgrade() -> None:
    op.drop_table('alert_deliveries')
    op.drop_table('alerts')
