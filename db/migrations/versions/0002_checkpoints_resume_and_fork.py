"""checkpoints, resume and fork

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 15:01:41.533627
"""
import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('checkpoints',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('bytes', sa.Integer(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('params_digest', sa.String(length=64), nullable=False),
    sa.Column('metrics_json', sa.Text(), nullable=False),
    sa.Column('blocked_s', sa.Float(), nullable=False),
    sa.Column('total_s', sa.Float(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('verified', sa.Boolean(), nullable=False),
    sa.Column('refused_reason', sa.Text(), nullable=True),
    sa.Column('pinned', sa.Boolean(), nullable=False),
    sa.Column('deleted', sa.Boolean(), nullable=False),
    sa.Column('deleted_at', sa.Float(), nullable=True),
    sa.Column('deleted_reason', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.create_index('ix_checkpoints_run_step', ['run_id', 'step'], unique=False)

    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('resume_dir', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('resume_step', sa.Integer(), nullable=True))

    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('parent_run_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('parent_step', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('parent_checkpoint_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('resume_checkpoint_id', sa.Integer(), nullable=True))
        batch_op.create_foreign_key('fk_runs_parent_checkpoint', 'checkpoints', ['parent_checkpoint_id'], ['id'],
                                    ondelete='SET NULL')
        batch_op.create_foreign_key('fk_runs_parent_run_id_runs', 'runs', ['parent_run_id'], ['id'],
                                    ondelete='SET NULL')
        batch_op.create_foreign_key('fk_runs_resume_checkpoint', 'checkpoints', ['resume_checkpoint_id'], ['id'],
                                    ondelete='SET NULL')


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_constraint('fk_runs_resume_checkpoint', type_='foreignkey')
        batch_op.drop_constraint('fk_runs_parent_run_id_runs', type_='foreignkey')
        batch_op.drop_constraint('fk_runs_parent_checkpoint', type_='foreignkey')
        batch_op.drop_column('resume_checkpoint_id')
        batch_op.drop_column('parent_checkpoint_id')
        batch_op.drop_column('parent_step')
        batch_op.drop_column('parent_run_id')

    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('resume_step')
        batch_op.drop_column('resume_dir')

    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_index('ix_checkpoints_run_step')

    op.drop_table('checkpoints')
