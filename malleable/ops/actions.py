"""``malleable actions``: the action log, newest last.

Every change the daemon made (or is making) to a job, as recorded before it
ran: kind, the step its state machine is at (or how it ended: done,
abandoned, failed), sizes, attempts, errors and notes. Filters: one job
(``--job``), created since a time or within a duration (``--since``), and at
most N rows (``--limit``, the newest N). Read-only.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click
from sqlalchemy import select
from sqlalchemy.orm import Session

from malleable.clitypes import LIMIT
from malleable.db import store
from malleable.db.models import Action, Job
from malleable.ops.access import effective_config, open_store
from malleable.ops.output import (
    BadInput,
    emit,
    handle_errors,
    iso,
    json_option,
    parse_since,
    store_options,
    table,
)
from malleable.ops.status import action_doc

SCHEMA = "malleable.actions/1"


def build_actions(s: Session, now: datetime, *, job: str | None = None,
                  since: datetime | None = None, limit: int = 50) -> dict:
    """The ``malleable.actions/1`` document (docs/cli-json.md).

    Args:
        s: a (read-only) session.
        now: generation time.
        job: only this Slurm job id.
        since: only actions created at or after this time.
        limit: the newest ``limit`` matching actions (>= 1), listed oldest first.

    Raises:
        BadInput: ``job`` is not in the store.
    """
    q = select(Action, Job.slurm_job_id).join(Job, Job.id == Action.job_id)
    if job is not None:
        row = store.get_job(s, job)
        if row is None:
            raise BadInput(f"--job {job}: not in the state store")
        q = q.where(Action.job_id == row.id)
    if since is not None:
        q = q.where(Action.created_at >= since)
    rows = s.execute(q.order_by(Action.id.desc()).limit(limit)).all()
    return {"schema": SCHEMA, "generated_at": iso(now),
            "filters": {"job": job, "since": iso(since), "limit": limit},
            "actions": [action_doc(a, sid) for a, sid in reversed(rows)]}


def render_actions(doc: dict) -> str:
    """The text view of a ``malleable.actions/1`` document."""
    if not doc["actions"]:
        return "no actions"
    return table(["ID", "CREATED", "JOBID", "KIND", "GPUS", "STATE", "TRIES", "UPDATED", "NOTE"],
                 [(a["id"], a["created_at"], a["job_id"], a["kind"],
                   f"{a['from_gpus']}->{a['to_gpus']}",
                   a["state"] + ("" if a["finished"] else " (in flight)"), a["attempts"],
                   a["updated_at"], "; ".join(x for x in (a["last_error"], a["note"]) if x))
                  for a in doc["actions"]], right=(0, 6))


@click.command("actions")
@store_options
@json_option
@click.option("--job", "job_id", metavar="ID", default=None, help="Only this job's actions.")
@click.option("--since", metavar="DURATION|TIME", default=None,
              help="Only actions created within DURATION (90s, 30m, 2h, 1d, 1w) or since an "
                   "ISO 8601 TIME (UTC unless a zone is given).")
@click.option("--limit", type=LIMIT, default=50, show_default=True,
              metavar="N", help="Show the newest N actions.")
@handle_errors
def actions(config_path: str | None, database_url: str | None, as_json: bool,
            job_id: str | None, since: str | None, limit: int) -> None:
    """The action log: what the daemon changed in Slurm, oldest first (read-only)."""
    now = datetime.now(UTC)
    since_t = parse_since(since, now) if since is not None else None
    config = effective_config(config_path, database_url)
    with open_store(config) as st, st.sessions() as s:
        doc = build_actions(s, now, job=job_id, since=since_t, limit=limit)
    emit(doc, as_json, render_actions)
