"""Alembic environment: runs the migrations on the connection `malleable.db.schema` hands over.

There is no alembic.ini: `malleable.db.schema.alembic_config` builds the
configuration in code and puts an open SQLAlchemy connection (from
`malleable.db.engine.make_engine`, so every SQLite pragma applies) in
``config.attributes["connection"]``. The whole upgrade runs in one
transaction; on SQLite (transactional DDL, ``BEGIN IMMEDIATE``) a failed or
killed upgrade leaves the schema as it was. ``render_as_batch`` lets later
migrations alter SQLite tables (copy-and-move).
"""

from __future__ import annotations

from alembic import context

from malleable.db.engine import make_engine
from malleable.db.models import Base

config = context.config


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        # Only when someone runs Alembic directly with sqlalchemy.url set.
        engine = make_engine(config.get_main_option("sqlalchemy.url"))
        with engine.connect() as conn:
            _migrate(conn)
        engine.dispose()
        return
    _migrate(connection)


def _migrate(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("malleable migrations run online only (malleable db upgrade)")
run()
