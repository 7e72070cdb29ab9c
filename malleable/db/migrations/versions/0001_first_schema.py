"""The first schema: every table of the state store.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29

Tables: jobs, job_events, progress_samples, estimates, decisions, targets,
actions, settings, lease (with its single row), progress_files. Times are
`UTCDateTime` (INTEGER microseconds since the epoch on SQLite, TIMESTAMPTZ on
PostgreSQL). This file is frozen: a schema change is a new revision.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from malleable.db.types import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UNFINISHED = "finished_at IS NULL"


def _id(big: bool = False) -> sa.Column:
    return sa.Column("id", BIG_ID if big else sa.Integer(), nullable=False)


def _job_id(table: str) -> list:
    return [sa.Column("job_id", sa.Integer(), nullable=False),
            sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=f"fk_{table}_job_id_jobs",
                                    ondelete="CASCADE")]


def _time(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, UTCDateTime(), nullable=nullable)


def _str(name: str, length: int, default: str | None = "") -> sa.Column:
    if default is None:
        return sa.Column(name, sa.String(length), nullable=False)
    return sa.Column(name, sa.String(length), server_default=default, nullable=False)


def _int(name: str, default: int | None = None, nullable: bool = False) -> sa.Column:
    kw = {"server_default": str(default)} if default is not None else {}
    return sa.Column(name, sa.Integer(), nullable=nullable, **kw)


def upgrade() -> None:
    op.create_table(
        "jobs",
        _id(),
        _str("slurm_job_id", 64, default=None),
        _str("name", 256), _str("user", 128),
        _int("uid", nullable=True),
        _str("account", 128), _str("partition", 128),
        sa.Column("malleable", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("spec_text", sa.Text(), nullable=True),
        sa.Column("spec", JSON_DOC, nullable=True),
        sa.Column("spec_error", sa.Text(), nullable=True),
        _str("state", 32, default=None),
        _str("reason", 128),
        sa.Column("held", sa.Boolean(), server_default=sa.false(), nullable=False),
        _int("gpus", 0), _int("nodes", 0), _int("gpus_per_node", 0),
        _time("submit_time", True), _time("start_time", True), _time("end_time", True),
        _int("restart_count", 0),
        _time("first_seen"), _time("last_seen"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("slurm_job_id", name="uq_jobs_slurm_job_id"),
    )
    op.create_index("ix_jobs_state", "jobs", ["state", "malleable"])

    op.create_table(
        "job_events",
        _id(big=True), *_job_id("job_events"),
        _time("time"),
        _str("kind", 32, default=None),
        sa.Column("old_state", sa.String(32), nullable=True),
        sa.Column("new_state", sa.String(32), nullable=True),
        _int("old_gpus", nullable=True), _int("new_gpus", nullable=True),
        _int("old_nodes", nullable=True), _int("new_nodes", nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
    )
    op.create_index("ix_job_events_job_time", "job_events", ["job_id", "time"])

    op.create_table(
        "progress_samples",
        _id(big=True), *_job_id("progress_samples"),
        _time("time"),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        _int("gpus"), _int("nodes", nullable=True), _int("batch_size"),
        sa.Column("metric", sa.Float(), nullable=True),
        sa.Column("grad_sqr", sa.Float(), nullable=True),
        sa.Column("grad_var", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_progress_samples"),
    )
    op.create_index("ix_progress_samples_job_time", "progress_samples", ["job_id", "time"])

    op.create_table(
        "estimates",
        _id(big=True), *_job_id("estimates"),
        _time("time"),
        _str("model", 64),
        sa.Column("params", JSON_DOC, nullable=False),
        sa.Column("remaining_work", sa.Float(), nullable=True),
        sa.Column("remaining_work_sd", sa.Float(), nullable=True),
        sa.Column("flags", JSON_DOC, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_estimates"),
    )
    op.create_index("ix_estimates_job_time", "estimates", ["job_id", "time"])

    op.create_table(
        "decisions",
        _id(),
        _time("time"),
        _str("policy", 64, default=None),
        sa.Column("params", JSON_DOC, nullable=False),
        _str("inputs_digest", 128),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("duration_s", sa.Float(), server_default="0", nullable=False),
        sa.Column("dry_run", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_decisions"),
    )
    op.create_index("ix_decisions_time", "decisions", ["time"])

    op.create_table(
        "targets",
        _id(big=True),
        _int("decision_id"),
        *_job_id("targets"),
        _int("gpus"), _int("batch_size", nullable=True),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.ForeignKeyConstraint(["decision_id"], ["decisions.id"],
                                name="fk_targets_decision_id_decisions", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_targets"),
        sa.UniqueConstraint("decision_id", "job_id", name="uq_targets_decision_id_job_id"),
    )
    op.create_index("ix_targets_job_id", "targets", ["job_id"])

    op.create_table(
        "actions",
        _id(), *_job_id("actions"),
        _int("decision_id", nullable=True),
        _str("kind", 32, default=None), _str("state", 32, default=None),
        _int("from_gpus", nullable=True), _int("to_gpus"),
        _int("from_nodes", nullable=True), _int("to_nodes", nullable=True),
        _int("attempts", 0),
        _time("created_at"), _time("updated_at"),
        _time("next_attempt_at", True), _time("finished_at", True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        _int("restart_count_at_start", 0),
        _time("signalled_at", True),
        sa.ForeignKeyConstraint(["decision_id"], ["decisions.id"],
                                name="fk_actions_decision_id_decisions", ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name="pk_actions"),
    )
    op.create_index("ix_actions_job_id", "actions", ["job_id"])
    op.create_index("ix_actions_decision_id", "actions", ["decision_id"])
    op.create_index("ix_actions_unfinished", "actions", ["job_id"],
                    sqlite_where=sa.text(UNFINISHED), postgresql_where=sa.text(UNFINISHED))

    op.create_table(
        "settings",
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("value", JSON_DOC, nullable=False),
        _time("updated_at"),
        sa.PrimaryKeyConstraint("key", name="pk_settings"),
    )

    lease = op.create_table(
        "lease",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("holder", sa.String(256), nullable=True),
        _time("acquired_at", True), _time("heartbeat_at", True),
        sa.CheckConstraint("id = 1", name="ck_lease_single_row"),
        sa.PrimaryKeyConstraint("id", name="pk_lease"),
    )
    op.bulk_insert(lease, [{"id": 1, "holder": None}])

    op.create_table(
        "progress_files",
        _id(), *_job_id("progress_files"),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("device", sa.BigInteger(), nullable=True),
        sa.Column("inode", sa.BigInteger(), nullable=True),
        sa.Column("offset", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("size", sa.BigInteger(), server_default="0", nullable=False),
        _time("last_read_at", True),
        sa.Column("lines_accepted", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("rejected", JSON_DOC, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_progress_files"),
        sa.UniqueConstraint("job_id", name="uq_progress_files_job_id"),
    )


def downgrade() -> None:
    for table in ("progress_files", "lease", "settings", "actions", "targets", "decisions",
                  "estimates", "progress_samples", "job_events", "jobs"):
        op.drop_table(table)
