"""panel_layouts: how each person arranged the Run page's charts (issue 56 item 7)

One new table (db/models.py: ``PanelLayout``), a row per person and scope: the curves pinned on
the Overview, the Metrics sections opened or closed and the chart open full width, as JSON. No
row of an earlier release changes; a database downgraded loses the layouts alone (every page
then opens with its defaults).

Revision ID: r004
Revises: r003
Create Date: 2027-02-20 10:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = 'r004'
down_revision = 'r003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('panel_layouts',
                    sa.Column('person', sa.String(length=255), nullable=False),
                    sa.Column('scope', sa.String(length=64), nullable=False),
                    sa.Column('layout_json', sa.Text(), nullable=False),
                    sa.Column('updated_at', sa.Float(), nullable=False),
                    sa.PrimaryKeyConstraint('person', 'scope'))


def downgrade() -> None:
    op.drop_table('panel_layouts')
