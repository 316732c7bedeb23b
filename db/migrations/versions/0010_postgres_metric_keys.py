"""metric store on PostgreSQL: no foreign keys on metric_points and metric_rollups; triggers on
runs delete a run's points and rollups instead

PostgreSQL checks a foreign key with a row-level trigger: one ``SELECT ... FOR KEY SHARE`` on
``runs`` and one on ``metric_names`` for every point and every rollup row written. That was most
of the server's time on ingest (50k points: 4.6 s with the two keys, 0.75 s without them, in
psql; BENCHMARKS.md). The keys protected nothing that matters there: points and rollups are only
written by a run's own rank 0, under its own run id and under name ids it has just resolved, and
that writer now checks its batch's runs and names once a batch (db/metricbulk.py) instead of
once a row. What the keys did that matters is kept: deleting a run (or emptying ``runs`` with
TRUNCATE ... CASCADE) deletes its points and rollups, through the triggers made here.

SQLite keeps its schema: its writer connection already skips the checks (``PRAGMA
foreign_keys=OFF`` on that connection only), and its other connections keep the cascade.

Downgrade restores the keys under their original names; points or rollups whose run or name no
longer exists (possible only while the keys were absent) are deleted first, as the cascade would
have deleted them, since the keys could not be created over them.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 06:20:00.000000
"""
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

# (table, column, referenced table, ON DELETE) of each key, and the name PostgreSQL gave it in
# 0005 (which left them unnamed: <table>_<column>_fkey).
KEYS = [
    ('metric_points', 'run_id', 'runs', 'CASCADE'),
    ('metric_points', 'name_id', 'metric_names', None),
    ('metric_rollups', 'run_id', 'runs', 'CASCADE'),
    ('metric_rollups', 'name_id', 'metric_names', None),
]

# Row level, like the foreign key's own cascade: each deleted run's rows go through the primary
# key's index (run_id leads it), never a scan of the whole table.
DELETE_FUNCTION = """
CREATE FUNCTION delete_run_metrics() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM metric_points WHERE run_id = OLD.id;
    DELETE FROM metric_rollups WHERE run_id = OLD.id;
    RETURN NULL;
END;
$$
"""
TRUNCATE_FUNCTION = """
CREATE FUNCTION truncate_run_metrics() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE metric_points, metric_rollups;
    RETURN NULL;
END;
$$
"""


def _postgres() -> bool:
    return op.get_bind().dialect.name == 'postgresql'


def _key_name(table: str, column: str) -> str:
    return f'{table}_{column}_fkey'


def upgrade() -> None:
    if not _postgres():
        return
    for table, column, _referred, _ondelete in KEYS:
        op.drop_constraint(_key_name(table, column), table, type_='foreignkey')
    op.execute(DELETE_FUNCTION)
    op.execute("CREATE TRIGGER runs_delete_metrics AFTER DELETE ON runs "
               "FOR EACH ROW EXECUTE FUNCTION delete_run_metrics()")
    op.execute(TRUNCATE_FUNCTION)
    op.execute("CREATE TRIGGER runs_truncate_metrics AFTER TRUNCATE ON runs "
               "FOR EACH STATEMENT EXECUTE FUNCTION truncate_run_metrics()")


def downgrade() -> None:
    if not _postgres():
        return
    op.execute("DROP TRIGGER runs_truncate_metrics ON runs")
    op.execute("DROP FUNCTION truncate_run_metrics()")
    op.execute("DROP TRIGGER runs_delete_metrics ON runs")
    op.execute("DROP FUNCTION delete_run_metrics()")
    for table, column, referred, ondelete in KEYS:
        op.execute(f"DELETE FROM {table} t WHERE NOT EXISTS (SELECT 1 FROM {referred} r WHERE r.id = t.{column})")
        op.create_foreign_key(_key_name(table, column), table, referred, [column], ['id'], ondelete=ondelete)
