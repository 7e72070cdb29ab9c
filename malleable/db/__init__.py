"""The state store: the daemon's memory.

Owns the SQLAlchemy 2.0 models (jobs, job events, progress samples, estimates,
decisions, targets, actions, settings, the single-daemon lease), engine and
session setup (SQLite in WAL mode by default, any SQLAlchemy URL otherwise),
the Alembic migrations and schema-version checks, and retention (downsampling
progress, pruning finished jobs). Other packages read and write through the
functions here; none builds its own engine.
"""
