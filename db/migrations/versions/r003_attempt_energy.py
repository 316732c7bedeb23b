"""attempt_energy: the energy each attempt's devices used, as the scheduler read it (issue 55)

One new table (db/models.py: ``AttemptEnergy``), a row per attempt and device: the joules so far,
how they were obtained (measured, estimated, not measured), the last reading the next one goes on
from (a scheduler that takes the attempt over continues from it). No row of an earlier release
changes; a database downgraded loses the energy figures alone.

Revision ID: r003
Revises: r002
Create Date: 2027-02-02 10:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = 'r003'
down_revision = 'r002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('attempt_energy',
                    sa.Column('attempt_id', sa.Integer(), nullable=False),
                    sa.Column('device', sa.String(length=32), nullable=False),
                    sa.Column('method', sa.String(length=16), nullable=False),
                    sa.Column('joules', sa.Float(), nullable=False),
                    sa.Column('counter', sa.Float(), nullable=True),
                    sa.Column('read_at', sa.Float(), nullable=False),
                    sa.Column('uncovered_s', sa.Float(), nullable=False),
                    sa.Column('note', sa.Text(), nullable=False),
                    sa.ForeignKeyConstraint(['attempt_id'], ['attempts.id'], ondelete='CASCADE'),
                    sa.PrimaryKeyConstraint('attempt_id', 'device'))


def downgrade() -> None:
    op.drop_table('attempt_energy')
