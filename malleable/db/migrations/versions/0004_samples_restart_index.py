"""An index for the latest run in which each job logged progress.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

* ``ix_progress_samples_job_restart`` on ``progress_samples (job_id, restart)``:
  every decide cycle asks, for each managed job, the largest ``restart`` among
  its samples (`malleable.daemon.history.reporting_runs`: a job that has not
  logged progress in its current run is not asked to checkpoint). With only the
  (job_id, time) index that read visits every sample of the job, so it grew with
  the job's age; with this one it is one index probe per job.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_progress_samples_job_restart", "progress_samples",
                    ["job_id", "restart"])


def downgrade() -> None:
    op.drop_index("ix_progress_samples_job_restart", table_name="progress_samples")
