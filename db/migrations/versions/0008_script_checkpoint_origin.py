"""a script checkpoint's original file (its pinned copy may live elsewhere), and a rerun request

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 10:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('checkpoints') as batch:
        batch.add_column(sa.Column('origin', sa.Text(), nullable=True))
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('start_fresh', sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('start_fresh')
    with op.batch_alter_table('checkpoints') as batch:
        batch.drop_column('origin')
