"""The state store: the daemon's memory.

Owns the SQLAlchemy 2.0 models (jobs, job events, progress samples, estimates,
decisions, targets, actions, settings, the single-daemon lease, progress-file
offsets), engine and session setup (SQLite in WAL mode by default, any
SQLAlchemy URL otherwise), the Alembic migrations and schema-version checks,
and retention (downsampling progress, pruning finished jobs). Other packages
read and write through the functions here; none builds its own engine.

Modules: `engine` (make_engine, session_factory), `models`, `types`,
`schema` (upgrade, downgrade, check_schema, prepare_schema), `store` (the
repository functions), `lease`, `retention`, `errors`, `cli` (``malleable
db``). See docs/state-store.md.
"""
