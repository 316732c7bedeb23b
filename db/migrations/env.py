"""Alembic environment: batch mode so ALTERs work on SQLite; one transaction per migration, so
that on PostgreSQL (transactional DDL) an interrupted upgrade leaves the schema at the last
revision that completed, never half-way through one."""

from alembic import context

from db.engine import make_engine
from db.models import Base, include_object

config = context.config


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if url is None:  # db.engine._alembic_config always sets it
        raise RuntimeError("the Alembic config has no sqlalchemy.url")
    engine = make_engine(url)
    with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            # Batch mode rebuilds a table by copy, drop and rename; with foreign keys on, the
            # drop would cascade and delete every attempt of every run.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=True,  # autogenerate writes ops that SQLite can run too
            # Autogenerate expects on each database only what the models say it holds (the metric
            # tables' keys are SQLite's only, see the initial migration).
            include_object=include_object(connection.dialect.name),
            transaction_per_migration=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
