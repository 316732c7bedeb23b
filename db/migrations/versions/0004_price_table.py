"""price table

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 16:40:04.140929
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('prices',
    sa.Column('device', sa.String(length=64), nullable=False),
    sa.Column('usd_per_hour', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('device')
    )


def downgrade() -> None:
    op.drop_table('prices')
