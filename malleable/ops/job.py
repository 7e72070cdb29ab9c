"""``malleable job show ID``: everything the daemon knows about one job.

Its identity and spec, the history of its states and sizes (job events), its
actions, the latest targets decisions gave it, its progress (lines stored,
per-run throughput, rejected lines by reason), its latest estimate, and the
fitted speedup curve: the goodput at each GPU count the job may use,
evaluated from the latest estimate's parameters by the estimators' own
function (`malleable.ops.views.goodput_curve`). ``--plot PATH`` also draws
the curve as an image in the format of its extension (PNG if none;
matplotlib, Agg backend).

Read-only; works for any user who can read the database.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import click
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from malleable.clitypes import GPUS_PER_NODE
from malleable.db import store
from malleable.db.models import FINISHED_STATES, Action, Decision, Job, ProgressSample, Target
from malleable.mpl import pyplot
from malleable.ops.access import effective_config, open_store
from malleable.ops.output import (
    BadInput,
    emit,
    finite,
    fmt_duration,
    fmt_number,
    handle_errors,
    iso,
    json_option,
    safe_text,
    store_options,
    table,
)
from malleable.ops.status import action_doc, slurm_reason
from malleable.ops.views import (
    RECENT_SAMPLES,
    GoodputCurve,
    estimate_bits,
    eta_with_wait,
    flag_names,
    goodput_curve,
    queue_wait,
    recent_throughput,
    remaining_time,
    resolve_gpus_per_node,
)
from malleable.progress.spool import SpoolDir

SCHEMA = "malleable.job/1"
TARGETS_SHOWN = 20


def _sample_doc(r) -> dict | None:
    if r is None:
        return None
    return {"time": iso(r.time), "step": r.step, "samples": r.samples, "gpus": r.gpus,
            "nodes": r.nodes, "batch_size": r.batch_size, "metric": finite(r.metric),
            "restart": r.restart}


def _runs(s: Session, job_id: int) -> list[dict]:
    """Per run (restart count): lines, GPUs, first and last time, throughput."""
    P = ProgressSample
    rows = s.execute(
        select(P.restart, func.count(), func.min(P.gpus), func.max(P.gpus), func.min(P.time),
               func.max(P.time), func.min(P.samples), func.max(P.samples))
        .where(P.job_id == job_id).group_by(P.restart).order_by(func.min(P.time)))
    out = []
    for restart, n, g_lo, g_hi, t0, t1, s0, s1 in rows:
        dt = (t1 - t0).total_seconds() if t0 is not None and t1 is not None else 0.0
        out.append({"restart": restart, "lines": int(n), "min_gpus": g_lo, "max_gpus": g_hi,
                    "first": iso(t0), "last": iso(t1),
                    "throughput": finite((s1 - s0) / dt, 3) if dt > 0 else None})
    return out


def _sizes(events) -> list[dict]:
    """The job's sizes over time, from its "new" and "size" events."""
    out = []
    for e in events:
        if e.kind in ("new", "size") and e.new_gpus is not None:
            out.append({"time": iso(e.time), "gpus": e.new_gpus, "nodes": e.new_nodes})
    return out


def curve_doc(curve: GoodputCurve | None, g_source: str) -> dict | None:
    """The ``curve`` object of the job document."""
    if curve is None:
        return None
    sp = curve.speedup
    return {"gpus_per_node": curve.gpus_per_node, "gpus_per_node_source": g_source,
            "goodput_1": finite(curve.goodput_1, 3),
            "points": [{"gpus": int(k), "nodes": int(n), "goodput": finite(g, 3),
                        "speedup": finite(x, 4), "batch_size": int(b)}
                       for k, n, g, x, b in zip(curve.gpus, curve.nodes, curve.goodput, sp,
                                                curve.batch, strict=True)]}


def build_job(s: Session, slurm_job_id: str, now: datetime, *,
              gpus_per_node: int | None = None,
              spool_dir: str | None = None) -> tuple[dict, GoodputCurve | None]:
    """The ``malleable.job/1`` document (docs/cli-json.md) and the goodput curve.

    ``spool_dir``: the daemon's progress spool, to name the file it reads for a
    malleable job none of whose files was read yet (``progress.expected_file``; None:
    not named).

    Raises:
        BadInput: the store does not know the job.
    """
    job = store.get_job(s, slurm_job_id)
    if job is None:
        tasks = [] if not slurm_job_id.isdigit() else list(s.scalars(
            select(Job.slurm_job_id).where(Job.slurm_job_id.like(f"{slurm_job_id}\\_%",
                                                                  escape="\\"))
            .order_by(Job.id).limit(4)))
        hint = ("; an array's tasks are shown one by one: "
                + ", ".join(tasks[:3]) + (", ..." if len(tasks) > 3 else "")) if tasks else ""
        raise BadInput(f"job {slurm_job_id!r}: not in the state store (never seen by the daemon, "
                       f"or pruned after [retention] finished_job_days){hint}")
    events = store.job_events(s, job.id)
    actions = list(s.scalars(select(Action).where(Action.job_id == job.id).order_by(Action.id)))
    targets = s.execute(
        select(Decision.id, Decision.time, Decision.policy, Decision.dry_run, Target.gpus,
               Target.batch_size, Target.reason)
        .join(Target, Target.decision_id == Decision.id).where(Target.job_id == job.id)
        .order_by(Decision.id.desc()).limit(TARGETS_SHOWN)).all()
    P = ProgressSample
    first = s.execute(select(P).where(P.job_id == job.id).order_by(P.time, P.id).limit(1)
                      ).scalars().first()
    recent = store.latest_samples(s, [job.id], RECENT_SAMPLES)[job.id]
    tp = recent_throughput(recent)
    pf = store.get_progress_file(s, job.id)
    est = store.latest_estimates(s, [job.id]).get(job.id)
    g, g_source = resolve_gpus_per_node(s, gpus_per_node)
    extra = [t.gpus for t in targets[:1]] + ([job.gpus] if job.gpus else [])
    curve = goodput_curve(est.params if est else None, job.spec, g, extra=extra,
                          flags=estimate_bits(est))
    work = finite(est.remaining_work) if est else None
    target_gpus = targets[0].gpus if targets else None
    at = target_gpus if target_gpus is not None else (job.gpus if job.state == "RUNNING" else 0)
    goodput = curve.at(at) if curve is not None and at else None
    wait = queue_wait(job.state, job.start_time, now, held=bool(job.held))
    params = (est.params or {}) if est else {}
    doc = {
        "schema": SCHEMA,
        "generated_at": iso(now),
        "job": {
            "job_id": job.slurm_job_id, "name": job.name, "user": job.user, "uid": job.uid,
            "account": job.account, "partition": job.partition, "malleable": job.malleable,
            "state": job.state, "reason": slurm_reason(job.reason), "held": job.held,
            "gpus": job.gpus, "nodes": job.nodes, "gpus_per_node": job.gpus_per_node,
            "arrival_time": iso(job.arrival_time), "submit_time": iso(job.submit_time),
            "start_time": iso(job.start_time), "end_time": iso(job.end_time),
            "restart_count": job.restart_count,
            "attained_gpu_s": finite(job.attained_gpu_s, 1),
            "first_seen": iso(job.first_seen), "last_seen": iso(job.last_seen)},
        "spec": {"text": job.spec_text, "parsed": job.spec, "error": job.spec_error},
        "sizes": _sizes(events),
        "events": [{"time": iso(e.time), "kind": e.kind, "old_state": e.old_state,
                    "new_state": e.new_state, "old_gpus": e.old_gpus, "new_gpus": e.new_gpus,
                    "old_nodes": e.old_nodes, "new_nodes": e.new_nodes, "detail": e.detail}
                   for e in events],
        "actions": [action_doc(a, job.slurm_job_id) for a in actions],
        "targets": [{"decision_id": t.id, "time": iso(t.time), "policy": t.policy,
                     "dry_run": t.dry_run, "gpus": t.gpus, "batch_size": t.batch_size,
                     "reason": t.reason} for t in targets],
        "progress": {
            "lines_stored": store.count_samples(s, job.id),
            "lines_accepted": pf.lines_accepted if pf else 0,
            "rejected": dict(pf.rejected or {}) if pf else {},
            "file": pf.path if pf else None,
            # No file read yet: where the daemon looks (a job writing elsewhere, e.g.
            # submitted by plain sbatch without MALLEABLE_SPOOL, shows up here).
            "expected_file": (SpoolDir(spool_dir).file_path_safe(job.slurm_job_id)
                              if spool_dir and job.malleable and pf is None else None),
            "first": _sample_doc(first),
            "last": _sample_doc(recent[-1] if recent else None),
            "throughput": None if tp is None else {
                "samples_per_s": finite(tp.samples_per_s, 3), "window_s": finite(tp.window_s, 3),
                "lines": tp.lines, "restart": tp.restart, "gpus": tp.gpus},
            "runs": _runs(s, job.id)},
        "estimate": None if est is None else {
            "time": iso(est.time), "model": est.model,
            "remaining_work": work, "remaining_work_sd": finite(est.remaining_work_sd),
            "p": finite(params.get("p")), "phi": finite(params.get("phi")),
            "m0": finite(params.get("m0")), "progress": finite(params.get("progress")),
            "flags": flag_names((est.flags or {}).get("bits")),
            "eta_s": finite(eta_with_wait(remaining_time(work, goodput), wait), 1),
            "wait_s": finite(wait, 1), "eta_gpus": at or None},
        "curve": curve_doc(curve, g_source),
        "plot": None,
    }
    return doc, curve


PLOT_FORMATS = frozenset({"png", "svg", "svgz", "pdf", "jpg", "jpeg", "tif", "tiff", "webp"})
"""The image formats ``--plot`` writes (where matplotlib's Agg canvas has them): not
PGF (needs a LaTeX installation), PostScript (no transparency: matplotlib warns) or
raw pixel buffers."""


def plot_format(path: str) -> str:
    """The image format ``--plot PATH`` writes: its extension's (``.png``, ``.svg``,
    ``.pdf``, ``.jpg``, ... as matplotlib's Agg canvas knows them), PNG if it has none.

    Raises:
        BadInput: an empty path, or an extension matplotlib cannot write (the message
            lists the ones it can).
    """
    if not path.strip():
        raise BadInput("--plot '': empty path (give a file name, e.g. curve.png)")
    if path.strip() == "-":
        raise BadInput("--plot -: an image is not written to standard output; give a file "
                       "name, e.g. curve.png")
    ext = Path(path).suffix.lower().lstrip(".")
    if not ext:
        return "png"
    pyplot()                          # (matplotlib imported quietly)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    known = PLOT_FORMATS & set(FigureCanvasAgg.get_supported_filetypes())
    if ext not in known:
        raise BadInput(f"--plot {path}: cannot write .{ext} images "
                       f"(known: {', '.join('.' + k for k in sorted(known))})")
    return ext


def plot_curve(doc: dict, path: str) -> str:
    """Draw the job's goodput curve (and linear scaling from its smallest count) as an
    image in the format of the path's extension (`plot_format`; none: PNG).

    Returns:
        The path written (absolute).

    Raises:
        BadInput: an empty path or unknown extension, the job has no curve (no
            estimate yet), or the file cannot be written.
    """
    fmt = plot_format(path)
    c = doc["curve"]
    if not doc["job"]["malleable"]:
        raise BadInput(f"--plot {path}: job {doc['job']['job_id']} is rigid (no valid "
                       f"malleable spec): the daemon never estimates it, so it has no "
                       f"speedup curve")
    if c is None or not c["points"]:
        raise BadInput(f"--plot {path}: job {doc['job']['job_id']} has no speedup curve yet "
                       f"(no estimate: the daemon estimates a job once it is managed)")
    plt = pyplot()

    ks = [p["gpus"] for p in c["points"]]
    gp = [p["goodput"] or 0.0 for p in c["points"]]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    try:
        ax.plot(ks, gp, "o-", label="fitted goodput")
        if gp[0] > 0:
            ax.plot(ks, [gp[0] * k / ks[0] for k in ks], ":", color="grey",
                    label=f"linear from {ks[0]} GPU(s)")
        j = doc["job"]
        if j["state"] == "RUNNING" and j["gpus"] in ks:
            ax.axvline(j["gpus"], color="tab:green", alpha=0.5, label=f"now: {j['gpus']} GPUs")
        if doc["targets"] and doc["targets"][0]["gpus"] in ks:
            t = doc["targets"][0]["gpus"]
            ax.axvline(t, color="tab:red", ls="--", alpha=0.5, label=f"target: {t} GPUs")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("goodput (samples at m0 per second)")
        est = doc["estimate"] or {}
        # The name is the job owner's text: no mathtext (a "$\foo$" failed the plot).
        ax.set_title(f"job {safe_text(j['job_id'])} ({safe_text(j['name'])}): fitted speedup, "
                     f"estimate {(est.get('time') or '').replace('T', ' ')}", fontsize=9,
                     parse_math=False)
        ax.set_xticks(ks)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        try:
            fig.savefig(path, format=fmt)
        except OSError as exc:
            raise BadInput(f"--plot {path}: cannot write: {exc.strerror or exc}") from None
        except (RuntimeError, ValueError) as exc:   # e.g. a writer's missing tool
            raise BadInput(f"--plot {path}: matplotlib could not write .{fmt}: {exc}") \
                from None
    finally:
        plt.close(fig)
    return os.path.abspath(path)


def _start_text(j: dict) -> str:
    """A pending job's start time in Slurm is its expected start (backfill's estimate),
    not a start that happened."""
    if j["state"] == "PENDING":
        return f"expected to start {j['start_time']} (Slurm's estimate)" if j["start_time"] \
            else "not started"
    return f"started {j['start_time'] or '-'}"


def _end_text(j: dict) -> str:
    """A finished job's end; a running job's end time is its time limit's (Slurm's), a
    pending job's is not one (it was printed as ``ended <a future time>``)."""
    if j["state"] in FINISHED_STATES:
        return f", ended {j['end_time'] or '-'}"
    if j["state"] == "RUNNING" and j["end_time"]:
        return f", time limit ends {j['end_time']}"
    return ""


def _wait_text(j: dict, e: dict) -> str:
    """What a pending job's ETA says of its wait in the queue."""
    if j["state"] != "PENDING" or e["eta_s"] is None:
        return ""
    if e.get("wait_s") is None:
        return " after it starts (Slurm gives no expected start)"
    return f" (of which {fmt_duration(e['wait_s'])} waiting for Slurm's expected start)"


def render_job(doc: dict) -> str:
    """The text view of a ``malleable.job/1`` document."""
    j, sp, pr = doc["job"], doc["spec"], doc["progress"]
    size = (f"{j['gpus']} GPUs ({j['nodes']} node(s) x {j['gpus_per_node']})"
            if j["gpus"] else "no GPUs")
    reason = (f", reason {safe_text(j['reason'])}" if j["reason"] and j["state"] == "PENDING"
              else "")
    # Name, user, comment (the spec), ...: anyone's text, one line each (`safe_text`).
    out = [f"job {safe_text(j['job_id'])} ({safe_text(j['name'])}, user {safe_text(j['user'])}, "
           f"partition {safe_text(j['partition'])}): "
           f"{safe_text(j['state'])}{' (held)' if j['held'] else ''}{reason}, {size}",
           f"spec:      {safe_text(sp['text'] or '-')}"
           + (f"  [INVALID: {safe_text(sp['error'])}]" if sp["error"] else ""),
           f"times:     arrived {j['arrival_time'] or '-'}, {_start_text(j)}"
           f"{_end_text(j)}; restarts {j['restart_count']}; attained "
           f"{fmt_number((j['attained_gpu_s'] or 0) / 3600, 'GPU-h')}"]
    tp = pr["throughput"]
    last = pr["last"]
    rej = ", ".join(f"{safe_text(k)} {v}" for k, v in sorted(pr["rejected"].items())) or "none"
    out.append(f"progress:  {pr['lines_stored']} lines stored ({pr['lines_accepted']} accepted, "
               f"rejected: {rej})")
    if pr.get("expected_file"):
        out.append(f"           no progress file read yet: the daemon reads "
                   f"{safe_text(pr['expected_file'])} (the job writes to "
                   f"$MALLEABLE_SPOOL/<job>.jsonl)")
    if last is not None:
        out.append(f"           last: step {last['step']}, {last['samples']:,} samples, "
                   f"{last['gpus']} GPUs, batch {last['batch_size']} at "
                   f"{last['time'].replace('T', ' ')}")
    if tp is not None:
        out.append(f"           throughput {fmt_number(tp['samples_per_s'], 'samples/s')} over "
                   f"the last {tp['lines']} lines ({fmt_duration(tp['window_s'])}, run "
                   f"{tp['restart']}, {tp['gpus']} GPUs)")
    if pr["runs"]:
        out += ["", "runs:", table(
            ["RUN", "GPUS", "LINES", "FIRST", "LAST", "SAMPLES/S"],
            [(r["restart"], r["min_gpus"] if r["min_gpus"] == r["max_gpus"]
              else f"{r['min_gpus']}-{r['max_gpus']}", r["lines"], r["first"], r["last"],
              fmt_number(r["throughput"])) for r in pr["runs"]], right=(0, 1, 2, 5))]
    e = doc["estimate"]
    out.append("")
    if e is None:
        out.append("estimate:  none yet")
    else:
        w = e["remaining_work"]
        out.append(f"estimate:  {e['time'].replace('T', ' ')} ({e['model']}): remaining work "
                   f"{fmt_number(w)} samples at m0"
                   + (f" (sd {fmt_number(e['remaining_work_sd'])})"
                      if e["remaining_work_sd"] else "")
                   + f", ETA {fmt_duration(e['eta_s'])}"
                   + (f" at {e['eta_gpus']} GPUs" if e["eta_gpus"] else "")
                   + _wait_text(j, e))
        out.append(f"           p = {fmt_number(e['p'])}, phi = {fmt_number(e['phi'])}, "
                   f"m0 = {fmt_number(e['m0'])}; flags: {', '.join(e['flags']) or 'none'}")
    c = doc["curve"]
    if c is not None:
        out += ["", f"speedup curve (fitted goodput; g = {c['gpus_per_node']} GPUs per node, from "
                    f"{c['gpus_per_node_source']}; "
                    f"speedup relative to 1 GPU):",
                table(["GPUS", "NODES", "GOODPUT", "SPEEDUP", "BATCH"],
                      [(p["gpus"], p["nodes"], fmt_number(p["goodput"]),
                        "-" if p["speedup"] is None else f"{p['speedup']:.2f}", p["batch_size"])
                       for p in c["points"]], right=(0, 1, 2, 3, 4))]
    if doc["plot"]:
        out.append(f"plot:      {safe_text(doc['plot'])}")
    out += ["", "history:", table(["TIME", "EVENT"], [(ev["time"], _event(ev))
                                                      for ev in doc["events"]])]
    out += ["", "actions:" if doc["actions"] else "actions:  none"]
    if doc["actions"]:
        out.append(table(["ID", "CREATED", "KIND", "GPUS", "STATE", "TRIES", "NOTE"],
                         [(a["id"], a["created_at"], a["kind"],
                           f"{a['from_gpus']}->{a['to_gpus']}", a["state"], a["attempts"],
                           a["last_error"] or a["note"] or "") for a in doc["actions"]],
                         right=(0, 5)))
    if doc["targets"]:
        out += ["", f"targets (latest {len(doc['targets'])} decisions):",
                table(["DECISION", "TIME", "POLICY", "GPUS", "BATCH", "REASON"],
                      [(t["decision_id"], t["time"], t["policy"] + (" (dry run)" if t["dry_run"]
                                                                    else ""),
                        t["gpus"], t["batch_size"], t["reason"]) for t in doc["targets"]],
                      right=(0, 3, 4))]
    return "\n".join(out)


def _event(e: dict) -> str:
    if e["kind"] == "new":
        return f"first seen: {e['new_state']}, {e['new_gpus']} GPUs"
    if e["kind"] == "state":
        return f"state {e['old_state']} -> {e['new_state']}" + (f" ({e['detail']})"
                                                              if e["detail"] else "")
    if e["kind"] == "size":
        return (f"size {e['old_gpus']} -> {e['new_gpus']} GPUs "
                f"({e['old_nodes']} -> {e['new_nodes']} nodes)")
    return f"{e['kind']}" + (f": {e['detail']}" if e["detail"] else "")


@click.group("job")
def job() -> None:
    """Inspect one job."""


@job.command("show")
@click.argument("job_id", metavar="ID")
@store_options
@json_option
@click.option("--plot", "plot_path", metavar="PATH", default=None,
              type=click.Path(dir_okay=False, writable=False),
              help="Also draw the fitted speedup curve to PATH, in the format of its "
                   "extension (.png, .svg, .pdf, .jpg, ...; none: PNG).")
@click.option("--gpus-per-node", type=GPUS_PER_NODE, default=None, metavar="G",
              help="GPUs per node for the curve's node counts (default: from slurm.conf, "
                   "else inferred from the jobs).")
@handle_errors
def show(job_id: str, config_path: str | None, database_url: str | None, as_json: bool,
         plot_path: str | None, gpus_per_node: int | None) -> None:
    """Show job ID: spec, sizes, actions, progress and the fitted speedup curve (read-only).

    ID is the Slurm job id as squeue prints it (an array task as 123_4).
    """
    config = effective_config(config_path, database_url)
    with open_store(config) as st, st.sessions() as s:
        doc, _ = build_job(s, job_id.strip(), datetime.now(UTC), gpus_per_node=gpus_per_node,
                           spool_dir=config.progress.spool_dir)
    if plot_path is not None:
        doc["plot"] = plot_curve(doc, plot_path)
    emit(doc, as_json, render_job)
