"""Alembic migrations of the state store (run through `malleable.db.schema`, no alembic.ini)."""
