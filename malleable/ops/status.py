"""``malleable status``: one table of the malleable jobs, under a header on the daemon.

The header: the active policy (and whether an operator set it), pause state,
the latest decision, the latest poll, GPUs held and targeted, and the
daemon's health from its lease, by the rule a daemon applies before taking
the lease over (`malleable.db.lease.lease_health`): *healthy* (a holder whose
heartbeat is within the lease timeout: the larger of ``[daemon]
lease_timeout_s`` and the holder's own), *stale* (a holder whose heartbeat is
older: the daemon died or hangs; or a holder on this host whose process is
gone) or *absent* (no holder: no daemon running). The table:
per malleable job its state, GPUs now -> target (the latest decision's),
throughput (samples/s over its latest progress lines), the estimated time to
finish at the target (remaining work of its latest estimate over the fitted
goodput at the target's GPU count, `malleable.ops.views`) and its latest
action with the step it is at.

Read-only; works for any user who can read the database. ``--check`` makes
the exit code say whether the daemon is healthy (1 when stale or absent, or
when a healthy daemon has not polled Slurm successfully for longer than
`poll_stale_after_s`: its polls are failing).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import click
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from malleable.clitypes import GPUS_PER_NODE
from malleable.config import Config
from malleable.db import store
from malleable.db.errors import CorruptSetting
from malleable.db.lease import LEASE_ID, LeaseInfo, lease_health
from malleable.db.models import FINISHED_STATES, Action, Job, Lease
from malleable.ops.access import effective_config, open_store
from malleable.ops.output import (
    Failed,
    age_s,
    emit,
    finite,
    fmt_duration,
    fmt_number,
    fmt_params,
    fmt_when,
    handle_errors,
    iso,
    json_option,
    safe_text,
    store_options,
    table,
)
from malleable.ops.views import (
    RECENT_SAMPLES,
    estimate_bits,
    eta_with_wait,
    goodput_basis,
    goodput_curve,
    queue_wait,
    recent_throughput,
    remaining_basis,
    remaining_time,
    resolve_gpus_per_node,
)
from malleable.policies.registry import DEFAULT, get_policy

SCHEMA = "malleable.status/1"


def policy_problem_effect(source: str) -> str:
    """What the daemon does with an unusable active policy, by where it comes from.

    Args:
        source: the policy document's ``source``: "operator" (`malleable policy set`,
            read by the daemon at every decision) or "config" (its configuration file).

    Returns:
        One clause for the text views: an operator's policy is replaced by `static` at
        the next decision; a configured one stops a daemon from starting (exit 2) and a
        reload (SIGHUP) to it is refused, the running settings kept.
    """
    if source == "operator":
        return "the daemon falls back to `static`"
    return ("a daemon does not start with this configuration (exit 2), and a reload to "
            "it is refused")


_POLICY_FIX = ("`malleable policy reset` clears the operator's policy choice (or `malleable "
               "policy set NAME` replaces it)")
_PAUSE_FIX = ("`malleable resume` rewrites it (or `malleable pause`, to stay paused; each "
              "writes who ran it when it changes the state)")
# How to repair a settings row that is not valid JSON, by key (`check_settings`).
SETTING_FIXES = {
    store.POLICY_NAME_KEY: _POLICY_FIX,
    store.POLICY_PARAMS_KEY: _POLICY_FIX,
    store.POLICY_BY_KEY: _POLICY_FIX,
    store.PAUSED_KEY: _PAUSE_FIX,
    store.PAUSED_BY_KEY: ("`malleable resume` then `malleable pause` (or the other way "
                          "round) rewrite it"),
    store.LAST_POLL_KEY: "the daemon rewrites it at its next successful poll of Slurm",
}


def check_settings(s: Session, *keys: str) -> None:
    """Refuse to go on when a ``settings`` row of ``keys`` is not valid JSON (the
    database was edited by hand; reading it would raise the JSON decoder's error).

    Raises:
        CorruptSetting: (a `StoreError`: exit 2) naming the key, its stored text and
            how to repair it (`SETTING_FIXES`).
    """
    bad = store.corrupt_setting(s, keys)
    if bad is not None:
        key, text = bad
        raise CorruptSetting(key, text, SETTING_FIXES.get(key, "write valid JSON into it"))


def policy_doc(s: Session, config: Config) -> dict:
    """The active policy: name, params, what ``default`` resolves to, and who set it.

    Raises:
        CorruptSetting: ``policy.name`` or ``policy.params`` is not valid JSON.
    """
    check_settings(s, store.POLICY_NAME_KEY, store.POLICY_PARAMS_KEY)
    stored = store.get_setting(s, store.POLICY_PARAMS_KEY)
    if stored and not isinstance(stored, Mapping):   # (`active_policy` would fail on it)
        raise CorruptSetting(store.POLICY_PARAMS_KEY, json.dumps(stored), _POLICY_FIX,
                             why="not a JSON object (the policy's parameters)")
    name, params = store.active_policy(s, config.policy.name, config.policy.params)
    by_operator = store.get_setting(s, store.POLICY_NAME_KEY, None) is not None
    return {"name": name, "resolved": DEFAULT if name == "default" else name,
            "params": params, "source": "operator" if by_operator else "config"}


def slurm_reason(reason: str | None) -> str | None:
    """Slurm's pending/hold reason, None for none ("None" is Slurm's word for none)."""
    return None if not reason or reason == "None" else reason


def daemon_health(s: Session, config: Config, now: datetime) -> dict:
    """The daemon's health from the lease row, by `malleable.db.lease.lease_health` (see
    the module docstring); ``lease_timeout_s`` is the timeout it applied, seconds."""
    row = s.scalars(select(Lease).where(Lease.id == LEASE_ID)).first()
    h = lease_health(LeaseInfo.of(row), now, config.daemon.lease_timeout_s)
    age = h.heartbeat_age_s
    return {"health": h.state, "holder": h.holder, "holder_gone": h.holder_gone,
            "acquired_at": iso(h.acquired_at), "heartbeat_at": iso(h.heartbeat_at),
            "heartbeat_age_s": None if age is None else round(age, 1),
            "lease_timeout_s": h.timeout_s}


def poll_stale_after_s(config: Config) -> float:
    """Seconds without a successful poll after which a running daemon's polls count as
    failing: three poll intervals plus one poll's worst case of Slurm retries (every
    attempt timing out), so that one slow poll is not an alarm."""
    sl = config.slurm
    return float(3 * config.daemon.poll_interval_s
                 + sl.command_timeout_s * (sl.max_retries + 1))


def action_doc(a: Action, slurm_job_id: str | None = None) -> dict:
    """One action as a JSON object (the ``action`` definition of docs/cli-json.md)."""
    return {"id": a.id, "job_id": slurm_job_id, "decision_id": a.decision_id, "kind": a.kind,
            "state": a.state, "finished": a.finished_at is not None,
            "from_gpus": a.from_gpus, "to_gpus": a.to_gpus, "from_nodes": a.from_nodes,
            "to_nodes": a.to_nodes, "attempts": a.attempts, "created_at": iso(a.created_at),
            "updated_at": iso(a.updated_at), "finished_at": iso(a.finished_at),
            "next_attempt_at": iso(a.next_attempt_at), "signalled_at": iso(a.signalled_at),
            "last_error": a.last_error, "note": a.note}


def last_actions(s: Session, job_ids: list[int]) -> dict[int, Action]:
    """The newest action of each job that has one."""
    if not job_ids:
        return {}
    newest = (select(func.max(Action.id)).where(Action.job_id.in_(job_ids))
              .group_by(Action.job_id))
    return {a.job_id: a for a in s.scalars(select(Action).where(Action.id.in_(newest)))}


def job_rows(s: Session, jobs: list[Job], targets: dict[int, Any], gpus_per_node: int,
             now: datetime) -> list:
    """The ``jobs`` entries of the status document (see docs/cli-json.md). ``now``
    (aware UTC) measures a pending job's wait to Slurm's expected start."""
    ids = [j.id for j in jobs]
    samples = store.latest_samples(s, ids, RECENT_SAMPLES) if ids else {}
    estimates = store.latest_estimates(s, ids) if ids else {}
    actions = last_actions(s, ids)
    out = []
    for j in jobs:
        running = j.state == "RUNNING"
        now_gpus = j.gpus if running else 0
        t = targets.get(j.id)
        target = t.gpus if t is not None else None
        tp = recent_throughput(samples.get(j.id, [])) if running else None
        est = estimates.get(j.id)
        work = finite(est.remaining_work) if est is not None else None
        at = target if target is not None else now_gpus
        curve = goodput_curve(est.params if est else None, j.spec, gpus_per_node, extra=[at],
                              flags=estimate_bits(est))
        goodput = curve.at(at) if curve is not None and at > 0 else None
        wait = queue_wait(j.state, j.start_time, now, held=bool(j.held))
        eta = eta_with_wait(remaining_time(work, goodput), wait)
        a = actions.get(j.id)
        out.append({
            "job_id": j.slurm_job_id, "name": j.name, "user": j.user, "state": j.state,
            "reason": slurm_reason(j.reason), "held": j.held, "gpus": now_gpus,
            "requested_gpus": j.gpus if j.state == "PENDING" else None,
            "target_gpus": target, "target_reason": t.reason if t is not None else None,
            "throughput": finite(tp.samples_per_s, 3) if tp else None,
            "remaining_work": finite(work, 1),
            "goodput_at_target": finite(goodput, 3),
            "eta_s": finite(eta, 1),
            "wait_s": finite(wait, 1),
            "remaining_basis": remaining_basis(estimate_bits(est)),
            "goodput_basis": goodput_basis(estimate_bits(est)),
            "estimate_time": iso(est.time) if est else None,
            "last_action": action_doc(a, j.slurm_job_id) if a is not None else None,
        })
    return out


def _paused_by(s: Session) -> str | None:
    """Who ran `malleable pause` (user, uid, host, time), if the store recorded it."""
    check_settings(s, store.PAUSED_BY_KEY)
    who = store.operator_change(s, store.PAUSED_BY_KEY, ("pause",))
    if who is None:
        return None
    return f"{who['by']} on {who['host']} at {who['time']}"


def build_status(s: Session, config: Config, now: datetime, *, where: str,
                 include_finished: bool = False, gpus_per_node: int | None = None) -> dict:
    """The ``malleable.status/1`` document (docs/cli-json.md).

    Args:
        s: a (read-only) session on the state store.
        config: settings (default policy, lease timeout).
        now: the time ages are measured to (aware UTC).
        where: the database as named in messages.
        include_finished: list finished malleable jobs too.
        gpus_per_node: g for the goodput curve; None: from slurm.conf, else the store
            (`malleable.ops.views.resolve_gpus_per_node`).
    """
    q = select(Job).where(Job.malleable.is_(True))
    if not include_finished:
        q = q.where(Job.state.not_in(sorted(FINISHED_STATES)))
    jobs = list(s.scalars(q.order_by(Job.arrival_time, Job.id)))
    decision = store.latest_decision(s)
    targets = {t.job_id: t for t in decision.targets} if decision is not None else {}
    g, g_source = resolve_gpus_per_node(s, gpus_per_node)
    # The daemon records each successful poll; a store written before that (or by
    # tests) has only the jobs' last_seen. With no job at all, last_seen says nothing.
    seen = s.scalar(select(func.max(Job.last_seen)))
    check_settings(s, store.LAST_POLL_KEY, store.PAUSED_KEY)
    polled = store.get_setting(s, store.LAST_POLL_KEY)
    try:
        polled = datetime.fromisoformat(polled) if isinstance(polled, str) else None
    except ValueError:
        raise CorruptSetting(store.LAST_POLL_KEY, json.dumps(polled),
                             SETTING_FIXES[store.LAST_POLL_KEY],
                             why="not an ISO 8601 time") from None
    if polled is not None and polled.tzinfo is None:   # (the daemon writes UTC with +00:00)
        polled = polled.replace(tzinfo=UTC)
    last_poll = max((t for t in (seen, polled) if t is not None), default=None)
    held = s.scalar(select(func.coalesce(func.sum(Job.gpus), 0)).where(
        Job.malleable.is_(True), Job.state == "RUNNING"))
    rows = job_rows(s, jobs, targets, g, now)
    health = daemon_health(s, config, now)
    policy = policy_doc(s, config)
    paused = store.is_paused(s)
    try:   # the registry's check, as `policy show` (validate_policy) and the daemon use it
        get_policy(policy["name"], **policy["params"])
        policy_problem = None
    except ValueError as exc:
        policy_problem = str(exc)
    poll_age = age_s(last_poll, now)
    stale_after = poll_stale_after_s(config)
    return {
        "schema": SCHEMA,
        "generated_at": iso(now),
        "database": where,
        "daemon": health,
        "policy": policy,
        "policy_problem": policy_problem,
        "paused": paused,
        "paused_by": _paused_by(s) if paused else None,
        "last_decision": None if decision is None else {
            "id": decision.id, "time": iso(decision.time), "age_s": age_s(decision.time, now),
            "policy": decision.policy, "params": decision.params,
            "objective": finite(decision.objective), "duration_s": finite(decision.duration_s),
            "dry_run": decision.dry_run},
        "last_poll": iso(last_poll),
        "last_poll_age_s": poll_age,
        "polls_stale": health["health"] == "healthy" and (poll_age is None
                                                          or poll_age > stale_after),
        "polls_stale_after_s": stale_after,
        "gpus_per_node": g,
        "gpus_per_node_source": g_source,
        # Targets of the jobs that have not ended: the latest decision may predate an end.
        "gpus": {"held": int(held or 0),
                 "target": sum(targets[j.id].gpus for j in jobs
                               if j.id in targets and j.state not in FINISHED_STATES)
                 if targets else None},
        "jobs": rows,
    }


def _gpus(row: dict) -> str:
    if row["state"] not in ("RUNNING", "PENDING"):
        return "-"
    now = row["gpus"] if row["state"] == "RUNNING" else (row["requested_gpus"] or 0)
    now_s = str(now) if row["state"] == "RUNNING" else f"({now})"
    tgt = row["target_gpus"]
    return f"{now_s} -> {tgt}" if tgt is not None else now_s


def _action(a: dict | None) -> str:
    if a is None:
        return "-"
    return f"{a['kind']} {a['from_gpus']}->{a['to_gpus']}: {a['state']}"


def _state(j: dict) -> str:
    """STATE as squeue would say it: the state, then held and Slurm's reason, e.g.
    ``PENDING (held, Resources)``."""
    pending = j["state"] == "PENDING"     # (a finished job keeps its last pending reason)
    why = (["held"] if j["held"] else []) + ([j["reason"]] if pending and j.get("reason")
                                             else [])
    return j["state"] + (f" ({', '.join(why)})" if why else "")


def _work_guessed(j: dict) -> bool:
    """An ETA whose remaining work is a guess (no declared target)."""
    return j["eta_s"] is not None and j.get("remaining_basis") in ("history", "default")


def _goodput_guessed(j: dict) -> bool:
    """An ETA whose goodput is the cluster's default prior."""
    return j["eta_s"] is not None and j.get("goodput_basis") == "default"


def _guessed(j: dict) -> bool:
    return _work_guessed(j) or _goodput_guessed(j)


def _wait_unknown(j: dict) -> bool:
    return j["eta_s"] is not None and j["state"] == "PENDING" and j.get("wait_s") is None


def _eta(j: dict) -> str:
    """ETA, marked ``~`` when it is a guess (`_work_guessed`, `_goodput_guessed`) and
    ``>`` for a pending job Slurm gives no expected start (its wait is not in it)."""
    return (("~" if _guessed(j) else "") + (">" if _wait_unknown(j) else "")
            + fmt_duration(j["eta_s"]))


def render_status(doc: dict) -> str:
    """The text view of a ``malleable.status/1`` document."""
    d = doc["daemon"]
    if d["health"] == "absent":
        health = "absent: no daemon holds the lease (none running?)"
    else:
        health = (f"{d['health']}: {safe_text(d['holder'])}, heartbeat "
                  f"{fmt_duration(d['heartbeat_age_s'])} ago (lease timeout "
                  f"{fmt_duration(d['lease_timeout_s'])})"
                  + ("; its process is gone (killed without releasing the lease)"
                     if d["holder_gone"] else ""))
    p = doc["policy"]
    pol = safe_text(p["name"]) + (f" (= {safe_text(p['resolved'])})"
                                  if p["resolved"] != p["name"] else "")
    pol += f" {fmt_params(p['params'])}".rstrip() + f", set by {p['source']}"
    dec = doc["last_decision"]
    if doc["policy_problem"]:
        pol += (f" -- PROBLEM: {safe_text(doc['policy_problem'])}; "
                f"{policy_problem_effect(p['source'])}")
    elif dec is not None and dec["policy"] != p["resolved"]:
        # A file edited but not reloaded, or a policy set since the latest decision.
        pol += f" (the latest decision ran {safe_text(dec['policy'])})"
    mode = ("PAUSED" + (f" by {safe_text(doc['paused_by'])}" if doc.get("paused_by") else "")
            + ": the daemon observes and plans but starts no action (malleable resume)"
            if doc["paused"] else "acting")
    if dec is not None and dec["dry_run"]:
        mode += "; DRY RUN: the latest decision changed nothing in Slurm"
    lines = [
        f"daemon:        {health}",
        f"policy:        {pol}",
        f"mode:          {mode}",
        "last decision: " + ("none" if dec is None else
                             f"{fmt_when(dec['time'], dec['age_s'])}, {safe_text(dec['policy'])}, "
                             f"{fmt_number(dec['duration_s'] * 1e3 if dec['duration_s'] is not None else None, 'ms')}"),
        f"last poll:     {fmt_when(doc['last_poll'], doc['last_poll_age_s'])}"
        + (f" -- POLLS FAILING: none succeeded for over "
           f"{fmt_duration(doc['polls_stale_after_s'])} (is Slurm answering? see the "
           "daemon's log)" if doc["polls_stale"] else ""),
        f"GPUs:          {doc['gpus']['held']} held by malleable jobs"
        + (f", {doc['gpus']['target']} targeted" if doc["gpus"]["target"] is not None else ""),
        "",
    ]
    rows = [(j["job_id"], j["name"], j["user"], _state(j),
             _gpus(j), fmt_number(j["throughput"]), _eta(j),
             _action(j["last_action"])) for j in doc["jobs"]]
    if rows:
        lines.append(table(["JOBID", "NAME", "USER", "STATE", "GPUS NOW -> TARGET",
                            "SAMPLES/S", "ETA", "LAST ACTION"], rows, right=(5, 6)))
        if any(_work_guessed(j) for j in doc["jobs"]):
            lines.append("~ no declared target: remaining work from finished jobs' sizes or "
                         "the default; it grows while the job runs")
        if any(_goodput_guessed(j) for j in doc["jobs"]):
            lines.append("~ no throughput measured yet and no finished job like it (same "
                         "model, else same name and user): the cluster's default goodput, "
                         "a guess")
        if any(_wait_unknown(j) for j in doc["jobs"]):
            lines.append("> pending, and Slurm gives no expected start: the run time alone, "
                         "its wait in the queue comes on top")
    else:
        lines.append("no malleable jobs")
    return "\n".join(lines)


@click.command("status")
@store_options
@json_option
@click.option("--all", "include_finished", is_flag=True, help="List finished malleable jobs too.")
@click.option("--gpus-per-node", type=GPUS_PER_NODE, default=None, metavar="G",
              help="GPUs per node for the goodput curve (default: from slurm.conf, else "
                   "inferred from the jobs).")
@click.option("--check", is_flag=True,
              help="Exit 1 unless the daemon is healthy and polling Slurm (for "
                   "monitoring).")
@handle_errors
def status(config_path: str | None, database_url: str | None, as_json: bool,
           include_finished: bool, gpus_per_node: int | None, check: bool) -> None:
    """Show the daemon's health, policy and the malleable jobs (read-only).

    Per job: state, GPUs now -> target, throughput, estimated time to finish at
    the target and the latest action. The daemon is healthy (its lease's heartbeat
    is within the larger of [daemon] lease_timeout_s and the holder's own), stale
    (older, or its process on this host is gone: it died or hangs) or absent
    (no daemon holds the lease). Exit 0; with --check, exit 1 unless the daemon is
    healthy and its polls of Slurm succeed.
    """
    config = effective_config(config_path, database_url)
    with open_store(config) as st, st.sessions() as s:
        doc = build_status(s, config, datetime.now(UTC), where=st.where,
                           include_finished=include_finished, gpus_per_node=gpus_per_node)
    emit(doc, as_json, render_status)
    if check and doc["daemon"]["health"] != "healthy":
        raise Failed(f"daemon {doc['daemon']['health']}")
    if check and doc["polls_stale"]:
        raise Failed(f"daemon healthy but no successful poll for "
                     f"{fmt_duration(doc['last_poll_age_s'])}")
