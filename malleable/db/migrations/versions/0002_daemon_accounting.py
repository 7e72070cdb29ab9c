"""What the daemon's decision needs and Slurm does not keep: arrival, attained service, run segment.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

* ``jobs.arrival_time``: the job's first submit time. Slurm resets a job's
  submit time on every requeue (DESIGN.md section 6), so JCT and age are
  measured from this column, set once when the job is first seen.
* ``jobs.attained_gpu_s``: attained service, GPU-seconds, accumulated at each
  poll while the job runs (LAS/Gittins priority, Tiresias).
* ``progress_samples.restart``: the run (Slurm restart count) a sample belongs
  to, so a throughput interval never spans a checkpoint-requeue.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from malleable.db.types import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("arrival_time", UTCDateTime(), nullable=True))
        b.add_column(sa.Column("attained_gpu_s", sa.Float(), server_default="0",
                               nullable=False))
    with op.batch_alter_table("progress_samples") as b:
        b.add_column(sa.Column("restart", sa.Integer(), nullable=True))
    op.execute("UPDATE jobs SET arrival_time = COALESCE(submit_time, first_seen)")


def downgrade() -> None:
    with op.batch_alter_table("progress_samples") as b:
        b.drop_column("restart")
    with op.batch_alter_table("jobs") as b:
        b.drop_column("attained_gpu_s")
        b.drop_column("arrival_time")
