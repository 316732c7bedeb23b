"""attempt phases: when each start-up phase of an attempt ended, as rank 0 saw it (issue 32)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 08:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.add_column(sa.Column('phase_marks_json', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.drop_column('phase_marks_json')
