"""script workloads: the script's own checkpoint files, the file an attempt resumed from, and
what the hang watchdog watches

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 10:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.add_column(sa.Column('resume_path', sa.Text(), nullable=True))
        batch.add_column(sa.Column('watching', sa.String(length=32), nullable=True))
    with op.batch_alter_table('checkpoints') as batch:
        batch.add_column(sa.Column('source', sa.String(length=16), nullable=False, server_default='runyard'))
        batch.add_column(sa.Column('file_mtime', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('checkpoints') as batch:
        batch.drop_column('file_mtime')
        batch.drop_column('source')
    with op.batch_alter_table('attempts') as batch:
        batch.drop_column('watching')
        batch.drop_column('resume_path')
