"""failures, retries and supervision

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 15:12:37.802719
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('stop_reason', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('phase', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('overrides_json', sa.Text(), nullable=False, server_default='{}'))
        batch_op.add_column(sa.Column('cause', sa.String(length=24), nullable=True))
        batch_op.add_column(sa.Column('failed_rank', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('exception', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('log_tail', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('last_checkpoint_step', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('steps_lost', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('failed_at', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('detected_at', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('hang_detected_at', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('retry_counted', sa.Boolean(), nullable=False, server_default=sa.true()))

    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('retries_used', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('retry_at', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('stop_mode', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('dump_requested_at', sa.Float(), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('dump_requested_at')
        batch_op.drop_column('stop_mode')
        batch_op.drop_column('retry_at')
        batch_op.drop_column('retries_used')

    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('retry_counted')
        batch_op.drop_column('hang_detected_at')
        batch_op.drop_column('detected_at')
        batch_op.drop_column('failed_at')
        batch_op.drop_column('steps_lost')
        batch_op.drop_column('last_checkpoint_step')
        batch_op.drop_column('log_tail')
        batch_op.drop_column('exception')
        batch_op.drop_column('failed_rank')
        batch_op.drop_column('cause')
        batch_op.drop_column('overrides_json')
        batch_op.drop_column('phase')
        batch_op.drop_column('stop_reason')

