"""scheduler leases: which scheduler owns an attempt, and the data folder of each scheduler; a
checkpoint's size as a 64-bit integer (PostgreSQL's INTEGER stops at 2 GiB)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 04:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('scheduler_heartbeat') as batch:
        batch.add_column(sa.Column('home', sa.Text(), nullable=True))
    with op.batch_alter_table('attempts') as batch:
        batch.add_column(sa.Column('scheduler_id', sa.Integer(), nullable=True))
        batch.create_index('ix_attempts_scheduler_id', ['scheduler_id'])
    with op.batch_alter_table('checkpoints') as batch:
        batch.alter_column('bytes', existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table('checkpoints') as batch:
        batch.alter_column('bytes', existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=False)
    with op.batch_alter_table('attempts') as batch:
        batch.drop_index('ix_attempts_scheduler_id')
        batch.drop_column('scheduler_id')
    with op.batch_alter_table('scheduler_heartbeat') as batch:
        batch.drop_column('home')
