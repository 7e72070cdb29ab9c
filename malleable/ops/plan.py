"""``malleable plan``: what the active policy would do now, without doing it.

It runs the daemon's own decision code once, in dry-run mode, on a private
scratch copy of the state store:

1. copy the store: for SQLite a consistent snapshot into memory (SQLite's
   online backup; it takes no write lock, so the running daemon is never
   blocked, and needs only read access); for other databases one transaction
   that is rolled back at the end;
2. on the copy, exactly the daemon's steps (`malleable.daemon.cycle.Daemon`
   with ``dry_run=True``): poll Slurm once through the port (one ``jobs()``
   and one ``nodes()`` call) and store the jobs, ingest the progress files this
   user can read, park actions if paused, build the policy's inputs
   (`malleable.daemon.inputs.build_inputs`), run the active policy with its
   hysteresis, and run the reconciler (`malleable.daemon.reconcile`);
3. print the targets and the actions the daemon would start, and throw the
   copy away.

Nothing is written to the real database (no decision, estimate or action is
recorded: ``"recorded": false`` in the JSON) and nothing is changed in Slurm
(dry run: the actuator is never called and no plan file is written). Differences
from the daemon's next cycle: the estimators start from the stored samples
rather than the daemon's in-memory state (they give the same state either way,
docs/estimators.md), and progress files this user cannot read are not
ingested (their stored samples are used).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import click
import numpy as np
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from malleable.config import Config
from malleable.daemon.cycle import CycleReport, Daemon
from malleable.db import store
from malleable.ops.access import Store, effective_config, open_store
from malleable.ops.output import (
    Failed,
    emit,
    finite,
    fmt_params,
    handle_errors,
    iso,
    json_option,
    safe_text,
    store_options,
    table,
)
from malleable.ops.status import check_settings, policy_doc
from malleable.slurm import connect_once
from malleable.slurm.client import SlurmClient
from malleable.slurm.records import JobState

SCHEMA = "malleable.plan/1"


@contextmanager
def scratch_sessions(st: Store) -> Iterator[sessionmaker[Session]]:
    """Read-write sessions on a throw-away copy of the store (see the module docstring).

    Raises:
        DatabaseUnavailable: the store cannot be read.
    """
    if st.engine.dialect.name == "sqlite":
        mem = sqlite3.connect(":memory:", check_same_thread=False)
        raw = st.engine.raw_connection()
        try:
            raw.driver_connection.backup(mem)
        finally:
            raw.close()
        mem.execute("PRAGMA foreign_keys = ON")
        engine = create_engine("sqlite://", creator=lambda: mem, poolclass=StaticPool)
        try:
            yield sessionmaker(bind=engine, expire_on_commit=False)
        finally:
            engine.dispose()
            mem.close()
        return
    conn = st.engine.connect()
    outer = conn.begin()
    try:
        yield sessionmaker(bind=conn, expire_on_commit=False,
                           join_transaction_mode="create_savepoint")
    finally:
        outer.rollback()
        conn.close()


class _Collect(logging.Handler):
    """Keeps the daemon code's warnings of this run, for the ``warnings`` list."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        job = getattr(record, "job", None)
        msg = record.getMessage()
        self.messages.append(f"job {job}: {msg}" if job not in (None, "-") else msg)


@contextmanager
def _collect_warnings() -> Iterator[_Collect]:
    log = logging.getLogger("malleable")
    handler = _Collect()
    old = log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.propagate = old


def build_plan(config: Config, st: Store, slurm: SlurmClient, now: datetime) -> dict:
    """Run the daemon's decision once in dry-run mode on a scratch copy; the
    ``malleable.plan/1`` document (docs/cli-json.md).

    Raises:
        Failed: Slurm did not answer the poll, or no node list could be read.
        DatabaseUnavailable: the store cannot be read.
        CorruptSetting: the pause or the operator's policy is not valid JSON.
    """
    rpc0 = int(getattr(slurm, "rpc_count", 0))
    with _collect_warnings() as warnings, scratch_sessions(st) as sessions:
        d = Daemon(slurm=slurm, sessions=sessions, clock=lambda: now,
                   spool_dir=config.progress.spool_dir, config=config, dry_run=True)
        with sessions() as s:
            check_settings(s, store.PAUSED_KEY)
            paused = store.is_paused(s)
            pol = policy_doc(s, config)
        report = CycleReport("decide", 0, now, paused=paused, dry_run=True)
        if not d.poll(now):
            raise Failed("Slurm did not answer the poll; nothing planned"
                         + (f" ({d.poll_error})" if d.poll_error else ""))
        report.ingest = d.ingest(now)
        d.drive(now, paused)
        decided = d.decide(now, report)
        if decided is None:
            raise Failed("Slurm's node list could not be read; nothing planned")
        inputs, alloc = decided
        d.apply(now, inputs, alloc, report, paused)
        observed = d.observed
    rpc = int(getattr(slurm, "rpc_count", 0)) - rpc0
    jobs = []
    for i, j in enumerate(inputs.jobs):
        sj = observed[j.slurm_job_id]
        running = sj.state == JobState.RUNNING
        jobs.append({"job_id": j.slurm_job_id, "name": j.name, "state": sj.state.value,
                     "gpus": sj.gpus if running else 0,
                     "requested_gpus": None if running else sj.gpus,
                     "target_gpus": int(alloc.gpus[i]),
                     "batch_size": int(alloc.batch[i]) or None,
                     "reason": alloc.reason[i]})
    return {
        "schema": SCHEMA,
        "generated_at": iso(now),
        "database": st.where,
        "recorded": False,
        "policy": pol,
        "paused": paused,
        "objective": finite(alloc.objective) if np.isfinite(alloc.objective) else None,
        "capacity": {"gpus_per_node": int(inputs.capacity.gpus_per_node),
                     "free_gpus": int(inputs.capacity.total),
                     "nodes": int(len(inputs.capacity.free_per_node))},
        "slurm_rpcs": rpc,
        "jobs": jobs,
        "actions": [{"job_id": p.job_id, "kind": p.kind.value, "from_gpus": p.from_gpus,
                     "to_gpus": p.to_gpus,
                     "to_nodes": p.to_shape.nodes if p.to_shape is not None else None,
                     "to_gpus_per_node": p.to_shape.gpus_per_node
                     if p.to_shape is not None else None,
                     "batch_size": p.batch or None, "reason": p.reason}
                    for p in report.planned],
        "skipped": [{"job_id": k.job_id, "reason": k.reason} for k in report.skipped],
        "excluded": [{"job_id": sid, "reason": why} for sid, why in inputs.excluded.items()],
        "warnings": warnings.messages,
    }


def render_plan(doc: dict) -> str:
    """The text view of a ``malleable.plan/1`` document."""
    p, c = doc["policy"], doc["capacity"]
    pol = safe_text(p["name"]) + (f" (= {safe_text(p['resolved'])})"
                                  if p["resolved"] != p["name"] else "")
    pol = f"{pol} {fmt_params(p['params'])}".rstrip()
    out = [f"plan of policy {pol} (set by {p['source']}) at {doc['generated_at']}: "
           f"{c['free_gpus']} GPUs for malleable jobs on {c['nodes']} nodes of "
           f"{c['gpus_per_node']} GPUs; {doc['slurm_rpcs']} Slurm queries",
           "dry run: nothing was changed in Slurm and nothing was recorded"]
    if doc["paused"]:
        out.append("PAUSED: the daemon would not start these actions until `malleable resume`")
    out.append("")
    if doc["jobs"]:
        out.append(table(["JOBID", "NAME", "STATE", "GPUS NOW -> TARGET", "BATCH", "REASON"],
                         [(j["job_id"], j["name"], j["state"],
                           f"{j['gpus'] if j['state'] == 'RUNNING' else '(' + str(j['requested_gpus']) + ')'}"
                           f" -> {j['target_gpus']}", j["batch_size"], j["reason"])
                          for j in doc["jobs"]], right=(4,)))
    else:
        out.append("no malleable jobs to allocate")
    out.append("")
    if doc["actions"]:
        out.append("actions the daemon would start:")
        out.append(table(["KIND", "JOBID", "GPUS", "SHAPE", "REASON"],
                         [(a["kind"], a["job_id"], f"{a['from_gpus']} -> {a['to_gpus']}",
                           f"{a['to_nodes']} x {a['to_gpus_per_node']}" if a["to_nodes"]
                           else "held", a["reason"]) for a in doc["actions"]]))
    else:
        out.append("no actions: every job is at its target (or left alone, below)")
    for title, key in (("left alone this cycle", "skipped"), ("not allocated", "excluded")):
        if doc[key]:
            out += ["", f"{title}:"] + _reason_lines(doc[key])
    if doc["warnings"]:
        # The daemon code's log lines, which quote e.g. a job's invalid spec (its comment).
        out += ["", "warnings:"] + [f"  {safe_text(w)}" for w in doc["warnings"]]
    return "\n".join(out)


def _reason_lines(rows: list[dict], show: int = 10) -> list[str]:
    """One line per job, but jobs that share a reason with more than ``show`` others
    (e.g. the waiting jobs beyond the queue depth) as one line: their count, the first
    ``show`` ids, the reason; ids and reasons through `safe_text`."""
    by_reason: dict[str, list[str]] = {}
    for x in rows:
        by_reason.setdefault(x["reason"], []).append(x["job_id"])
    out = []
    for x in rows:
        ids = by_reason[x["reason"]]
        reason = safe_text(x["reason"])
        if len(ids) <= show + 1:
            out.append(f"  {safe_text(x['job_id'])}: {reason}")
        elif ids[0] == x["job_id"]:
            out.append(f"  {len(ids)} jobs ({safe_text(', '.join(ids[:show]))}, ...): {reason}")
    return out


@click.command("plan")
@store_options
@json_option
@handle_errors
def plan(config_path: str | None, database_url: str | None, as_json: bool) -> None:
    """Show what the active policy would do now, without doing it.

    Polls Slurm once, runs the daemon's decision code in dry-run mode on a
    scratch copy of the state store, and prints the targets and actions.
    Nothing is recorded and nothing changes in Slurm. Slurm is asked once per call
    ([slurm] command_timeout_s; the daemon's retries, max_retries, are not used at a
    prompt): exit 1 if it does not answer.
    """
    config = effective_config(config_path, database_url)
    with open_store(config) as st:
        # The database first: what the plan reads of it before polling (the pause and
        # the operator's policy) must be readable, or that is the error, without a
        # Slurm round trip (connecting may ask slurmctld its version).
        with st.sessions() as s:
            check_settings(s, store.PAUSED_KEY)
            policy_doc(s, config)
        doc = build_plan(config, st, connect_once(config.slurm), datetime.now(UTC))
    emit(doc, as_json, render_plan)
