"""run workspace: a run's star, archive mark and note, edited after submit (issue 29, items 7 and 8)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 08:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('starred', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.add_column(sa.Column('archived', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.add_column(sa.Column('note', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        for name in ('note', 'archived', 'starred'):
            batch.drop_column(name)
