"""Indexes for the two per-cycle reads of a job's history: its back-off and its hold.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07

Every decide cycle asks two questions of every managed job
(`malleable.daemon.history`); with only the per-job indexes each read visited
all of the job's events or actions, so its cost grew with the queue times the
jobs' age (a long queue of jobs that were held and admitted many times):

* ``ix_job_events_kind_job`` on ``job_events (kind, job_id, time)``: the
  missed checkpoints (``no_checkpoint`` events) behind the requeue back-off
  (`requeue_backoff`). Such events are rare; with this index the read probes
  one index range per job and finds none, instead of walking every event.
* ``ix_actions_job_state_kind`` on ``actions (job_id, state, kind, finished_at)``:
  the latest finished action that changed a job's hold (`daemon_holds`). It
  covers the read (the row id is the key), so no action row is visited.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_job_events_kind_job", "job_events", ["kind", "job_id", "time"])
    op.create_index("ix_actions_job_state_kind", "actions",
                    ["job_id", "state", "kind", "finished_at"])


def downgrade() -> None:
    op.drop_index("ix_actions_job_state_kind", table_name="actions")
    op.drop_index("ix_job_events_kind_job", table_name="job_events")
