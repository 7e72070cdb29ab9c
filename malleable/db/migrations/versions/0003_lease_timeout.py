"""The lease holder's own timeout, so that a newcomer cannot judge a healthy lease stale.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

* ``lease.timeout_s``: the holder's ``[daemon] lease_timeout_s`` in seconds, written
  when it takes the lease. A second daemon started with a smaller timeout once took
  the lease from a healthy daemon (whose heartbeat, every timeout / 3 of its own, was
  "stale" by the newcomer's measure), and the healthy one stopped. A lease is now
  stale only when its heartbeat is older than the larger of the two timeouts.
  NULL (a lease taken before this revision): the newcomer's timeout alone, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lease") as b:
        b.add_column(sa.Column("timeout_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("lease") as b:
        b.drop_column("timeout_s")
