"""Migration scripts, one per schema revision (Alembic skips this file)."""
