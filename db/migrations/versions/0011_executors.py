"""executors: where a run and each attempt runs (local or a Slurm job), and Slurm's view of the job

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 08:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('executor', sa.String(length=16), server_default='local', nullable=False))
    with op.batch_alter_table('attempts') as batch:
        batch.add_column(sa.Column('executor', sa.String(length=16), server_default='local', nullable=False))
        batch.add_column(sa.Column('job_id', sa.String(length=64), nullable=True))
        batch.add_column(sa.Column('job_state', sa.String(length=32), nullable=True))
        batch.add_column(sa.Column('job_reason', sa.Text(), nullable=True))
        batch.add_column(sa.Column('job_nodes', sa.Text(), nullable=True))
        batch.add_column(sa.Column('job_state_at', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        for name in ('job_state_at', 'job_nodes', 'job_reason', 'job_state', 'job_id', 'executor'):
            batch.drop_column(name)
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('executor')
