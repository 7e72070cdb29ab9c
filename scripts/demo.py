#!/usr/bin/env python3
"""The end-to-end demo: malleable against plain Slurm on two real local clusters.

``make demo`` runs this with the project's venv. It:

1. brings up two Slurm harnesses of 4 nodes x 4 fake GPUs, each with its own
   ports and directory: side ``malleable`` and side ``static``;
2. starts ``malleable daemon`` on each: with the default policy on side
   ``malleable``; on side ``static`` with the ``static`` policy, which never
   resizes a job and starts them first-come first-served with backfill at
   every decide cycle (``--baseline plain`` instead runs it with ``--dry-run``:
   Slurm schedules alone, with its backfill every 30 s, which measured slower
   than the static policy); JCTs come from both daemons' state stores;
3. replays the same subset of a Pollux workload (derived from Microsoft's
   Philly trace) onto both at the same time with `malleable replay`'s recipe,
   time-compressed (40x by default): each job an emulated job following its
   model's measured T4 profile, plus one real PyTorch job on each side;
4. shows a live status table while they run (`malleable status` of the
   malleable side, one line for the static side);
5. when every job has ended, prints the per-job and average JCT of both sides,
   their ratio, and the simulator's prediction of both runs
   (`malleable.sim.predict`: the same recipes, compression, daemon
   configuration, and the restart cost measured on the harness); checks that no
   job was lost or left held and that every requeue followed a checkpoint; writes
   a report directory (report.json, jobs.csv, plots);
6. stops the daemons and takes both harnesses down, also on failure or Ctrl-C,
   so it can run again.

``--short`` is the CI form: a handful of jobs on one harness (malleable side
only) in about two minutes, checking the whole path. Exit code 0 when the run
completed (and, in the full form, the comparison could be made), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from malleable.config import SlurmConfig, load_config  # noqa: E402
from malleable.replay import ReplayJob, recipe, recipes_as_dicts, replay, select  # noqa: E402
from malleable.sim.traces import load_pollux_workload  # noqa: E402
from malleable.slurm import connect  # noqa: E402
from malleable.spec import MalleableSpec  # noqa: E402

HARNESS = ROOT / "scripts" / "slurm-harness"
VENV_BIN = Path(sys.executable).parent
WORKLOADS = ROOT / "malleable" / "sim" / "data" / "pollux" / "workloads"


def log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port_block(n: int, start: int) -> int:
    """The first base >= start with n consecutive free TCP ports."""
    base = start
    while base < 60000:
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
        base += n + 1
    raise RuntimeError(f"no {n} free ports")


@dataclass
class Side:
    """One harness with its daemon."""

    name: str
    policy: str
    root: Path
    ctld_port: int
    dry_run: bool = False     # observe only: plain Slurm (the daemon records, never acts)
    daemon: subprocess.Popen | None = None
    records: list[dict] = field(default_factory=list)

    @property
    def harness_dir(self) -> Path:
        return self.root / "harness"

    @property
    def conf(self) -> Path:
        return self.harness_dir / "slurm.conf"

    @property
    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf),
                "MALLEABLE_CONFIG": str(self.root / "malleable.toml")}

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def db(self) -> Path:
        return self.root / "malleable.db"

    def client(self):
        return connect(SlurmConfig(), env=self.env)


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HARNESS), *args], capture_output=True, text=True,
                          timeout=900)


def bring_up(side: Side, nodes: int, gpus: int) -> None:
    # A fresh controller numbers jobs from 1 again: every run starts from an empty
    # state directory, or the previous run's database rows and checkpoints would be
    # taken for this run's jobs.
    if side.harness_dir.exists():
        harness("down", "--dir", str(side.harness_dir))
    if side.root.exists():
        shutil.rmtree(side.root)
    side.root.mkdir(parents=True)
    for sub in ("spool", "work", "ckpt"):
        (side.root / sub).mkdir(exist_ok=True)
    side.spool.chmod(0o1733)
    r = harness("up", "--dir", str(side.harness_dir), "--nodes", str(nodes),
                "--gpus-per-node", str(gpus), "--ctld-port", str(side.ctld_port),
                "--node-port-base", str(side.ctld_port + 1))
    if r.returncode != 0:
        raise RuntimeError(f"harness {side.name} did not come up: {r.stderr.strip()}")
    log(f"side {side.name}: {nodes} nodes x {gpus} GPUs up ({side.conf})")


def write_config(side: Side, poll_s: float, decide_s: float) -> None:
    (side.root / "malleable.toml").write_text(f"""\
# Written by scripts/demo.py for side {side.name!r}.
[database]
url = "sqlite:///{side.db}"
[progress]
spool_dir = "{side.spool}"
[daemon]
poll_interval_s = {poll_s}
ingest_interval_s = {poll_s}
decide_interval_s = {decide_s}
requeue_backoff_s = 120
max_concurrent_requeues = 4
[policy]
name = "{side.policy}"
cooldown_s = {4 * decide_s}
# No lease: the demo compresses the trace 40x but not the restart costs, so ten restart
# costs would be a lease of hours at the trace's scale.
min_run_restarts = 0
default_restart_cost_s = 10
""")


def start_daemon(side: Side) -> None:
    with open(side.root / "daemon.log", "w") as out:  # the child keeps its own descriptor
        argv = [str(VENV_BIN / "malleable"), "daemon"] + (["--dry-run"] if side.dry_run else [])
        side.daemon = subprocess.Popen(argv, env=side.env, stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=subprocess.STDOUT, cwd=side.root)
    mode = "--dry-run: observes and records, never acts" if side.dry_run else "acting"
    log(f"side {side.name}: daemon started (policy {side.policy}, {mode}; "
        f"log {side.root}/daemon.log)")


def stop_daemon(side: Side) -> None:
    if side.daemon is None or side.daemon.poll() is not None:
        return
    side.daemon.send_signal(signal.SIGTERM)
    try:
        side.daemon.wait(timeout=60)
    except subprocess.TimeoutExpired:
        side.daemon.kill()
        side.daemon.wait()


def job_env(side: Side) -> tuple[tuple[str, str], ...]:
    return (("MALLEABLE_EXAMPLES", str(ROOT / "examples")),
            ("MALLEABLE_PYTHON", sys.executable),
            ("MALLEABLE_CKPT_DIR", str(side.root / "ckpt")))


def run_replay(side: Side, recipes: list[ReplayJob], speedup: float, errors: list) -> None:
    try:
        replay(side.client(), recipes, script=str(ROOT / "examples/emulated_job.sbatch"),
               speedup=speedup, spool_dir=str(side.spool), gpus_per_node=4,
               log_path=str(side.root / "replay.jsonl"), extra_env=job_env(side),
               workdir=str(side.root / "work"), on_submit=side.records.append)
    except Exception as exc:  # reported by the main thread
        errors.append(f"replay on {side.name}: {exc}")


def jobs_done(side: Side) -> tuple[int, int]:
    """(ended, submitted) of the side's jobs so far, from Slurm.

    Raises:
        RuntimeError: Slurm could not launch a job (it holds it: "launch failed
            requeued held"), e.g. a node whose slurmd is not the harness's own.
    """
    ids = {r["job_id"] for r in list(side.records)}
    if not ids:
        return 0, 0
    jobs = [j for j in side.client().jobs() if j.job_id in ids]
    failed = [j.job_id for j in jobs if "launch failed" in (j.reason or "").lower()]
    if failed:
        raise RuntimeError(f"side {side.name}: Slurm could not launch job(s) "
                           f"{', '.join(failed)} (launch failed requeued held); see "
                           f"{side.harness_dir}/log")
    # A job that ended more than MinJobAge (300 s) ago is no longer listed: ended too.
    live = {j.job_id for j in jobs if not j.state.finished}
    return len(ids - live), len(ids)


def collect(side: Side) -> list[dict]:
    """Per replayed job: its JCT measured on the side's cluster (end - submit, seconds),
    restarts and final state, from the side's state store."""
    from sqlalchemy import select as sql_select

    from malleable.db.engine import make_engine, session_factory
    from malleable.db.models import Job

    engine = make_engine(f"sqlite:///{side.db}", create=False)
    by_id = {r["job_id"]: r for r in side.records}
    out = []
    with session_factory(engine, readonly=True)() as s:
        for job in s.scalars(sql_select(Job).where(Job.slurm_job_id.in_(sorted(by_id)))):
            rec = by_id[job.slurm_job_id]
            start = job.arrival_time.timestamp() if job.arrival_time else rec["submitted_at"]
            end = job.end_time.timestamp() if job.end_time else None
            out.append({"name": rec["name"], "job_id": job.slurm_job_id, "model": rec["model"],
                        "real": bool(rec.get("real")),
                        "state": job.state, "restarts": job.restart_count,
                        "jct_s": None if end is None else round(end - start, 3),
                        "attained_gpu_s": round(job.attained_gpu_s or 0.0, 1)})
    engine.dispose()
    return sorted(out, key=lambda r: r["name"])


def wait_recorded(side: Side, expected: int, timeout_s: float = 60.0) -> None:
    """Wait until the side's daemon has recorded every job's end (its next poll after
    Slurm ended the last one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = collect(side)
        if len(jobs) >= expected and all(j["jct_s"] is not None for j in jobs):
            return
        time.sleep(1)
    log(f"side {side.name}: not every job's end was recorded within {timeout_s:.0f} s")


def gpu_timeline(side: Side) -> dict[str, list[tuple[float, int]]]:
    """Per job, (seconds since the first submission, GPUs) at each size or state change."""
    from sqlalchemy import select as sql_select

    from malleable.db.engine import make_engine, session_factory
    from malleable.db.models import Job, JobEvent

    engine = make_engine(f"sqlite:///{side.db}", create=False)
    names = {r["job_id"]: r["name"] for r in side.records}
    t0 = min((r["submitted_at"] for r in side.records), default=0.0)
    out: dict[str, list[tuple[float, int]]] = {}
    with session_factory(engine, readonly=True)() as s:
        q = (sql_select(Job.slurm_job_id, JobEvent.time, JobEvent.new_gpus,
                        JobEvent.new_state)
             .join(JobEvent, JobEvent.job_id == Job.id)
             .where(Job.slurm_job_id.in_(sorted(names))).order_by(JobEvent.id))
        gpus: dict[str, int] = {}
        running: dict[str, bool] = {}
        for sid, t, new_gpus, new_state in s.execute(q):
            if new_gpus is not None:
                gpus[sid] = new_gpus
            if new_state is not None:
                running[sid] = new_state == "RUNNING"
            k = gpus.get(sid, 0) if running.get(sid) else 0
            out.setdefault(names[sid], []).append((t.timestamp() - t0, k))
    engine.dispose()
    return out


DEMO_MODELS = ("cifar10", "ncf", "bert", "deepspeech2")
DEMO_HOURS = 4.0
TORCH_NAME = "torch-mlp"
TORCH_SPEC = MalleableSpec(min_gpus=1, max_gpus=4, signal="USR1", grace_s=60, batch_size=64,
                           target_steps=600)
TORCH_ARGS = "--steps 600 --step-sleep 0.05 --log-every 10 --procs 1"


def submit_torch_job(side: Side) -> None:
    """The real PyTorch job (examples/torch_job.py: an MLP trained with SGD on CPU, one
    process: the harness's GPUs are files and the machine has 2 cores), on 2 GPUs."""
    from malleable.submit import malleable_request

    request = malleable_request(str(ROOT / "examples/torch_job.sbatch"), TORCH_SPEC,
                                initial_gpus=2, gpus_per_node=4, spool_dir=str(side.spool),
                                name=TORCH_NAME,
                                extra_env=(*job_env(side), ("JOB_ARGS", TORCH_ARGS)),
                                workdir=str(side.root / "work"))
    job_id = side.client().submit(request)
    side.records.insert(0, {"name": TORCH_NAME, "job_id": job_id, "submitted_at": time.time(),
                            "model": "torch", "real": True})


PROBE_SCRIPT = """#!/bin/sh
# scripts/demo.py's probe: when did Slurm start me?
date +%s.%N > "$PROBE_FILE"
"""


def probe_start_latency(side: Side, probes: int = 3) -> list[float]:
    """Slurm's latency from a submission to the start of a job that fits, measured on
    the empty cluster before the replay: seconds from submitting a 1-GPU rigid job
    (the daemon leaves it alone) to its first command, ``probes`` times."""
    from malleable.slurm.records import SubmitRequest

    script = side.root / "probe.sh"
    script.write_text(PROBE_SCRIPT)
    script.chmod(0o755)
    client = side.client()
    out = []
    for i in range(probes):
        mark = side.root / f"probe-{i}.t"
        t0 = time.time()
        job_id = client.submit(SubmitRequest(script=str(script), nodes=1, gpus_per_node=1,
                                             name="probe", requeue=False,
                                             output=str(side.root / "probe.out"),
                                             workdir=str(side.root),
                                             env=(("PROBE_FILE", str(mark)),)))
        deadline = time.monotonic() + 60
        while not mark.exists() or not mark.read_text().strip():
            if time.monotonic() > deadline:
                job = client.job(job_id)
                seen = (f"{job.state.value}, reason {job.reason or 'none'}" if job
                        else "no longer in squeue")
                raise RuntimeError(f"side {side.name}: probe job {job_id} did not start in "
                                   f"60 s (Slurm: {seen})")
            time.sleep(0.05)
        out.append(float(mark.read_text()) - t0)
        time.sleep(1.0)   # let it end before the next one
    return out


def show_status(sides: list[Side], expected: int, counts: dict[str, tuple[int, int]]) -> None:
    """The live view: one line per side, then `malleable status` of each side that still
    has jobs running or pending (``counts``: each side's `jobs_done`)."""
    if sys.stdout.isatty():
        print("\033[H\033[J", end="")
    log("  ".join(f"{s.name}: {d} of {n} submitted jobs ended ({expected} in all)"
                  for s in sides for d, n in [counts[s.name]]))
    for s in sides:
        d, n = counts[s.name]
        if d == n == expected:
            continue
        out = subprocess.run([str(VENV_BIN / "malleable"), "status"], env=s.env,
                             capture_output=True, text=True, timeout=60)
        print(f"--- {s.name} ({s.policy}) ---")
        print(out.stdout.rstrip() or out.stderr.rstrip(), flush=True)


def spool_lines(side: Side, job_id: str) -> list[dict]:
    """The progress lines a job wrote (its spool file), in order."""
    path = side.spool / f"{job_id}.jsonl"
    if not path.exists():
        return []
    out = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


def measured_startup(sides: list[Side], probes: list[float]) -> dict:
    """What the simulator needs to know about the clusters, measured on this run (median
    seconds): from Slurm starting a job's run to its ``started`` line (process start
    and checkpoint load: the restart cost the simulator charges), over the last run of
    every emulated job on both sides; from a ``checkpointed`` line to the next run's
    ``started`` line (what a checkpoint-requeue cost); Slurm's latency from a
    submission to the start of a job that fits (``sched_s``, from ``probes``:
    `probe_start_latency`); and, for the record, from a trace job's submission to its
    first ``started`` line (``first_start_s``, queueing included)."""
    from sqlalchemy import select as sql_select

    from malleable.db.engine import make_engine, session_factory
    from malleable.db.models import Job

    startup, requeue, first = [], [], []
    for side in sides:
        for rec in side.records:
            started = [x for x in spool_lines(side, rec["job_id"]) if x.get("event") == "started"]
            if started and not rec.get("real"):
                first.append(started[0]["t"] - rec["submitted_at"])
        emulated = {r["job_id"] for r in side.records if not r.get("real")}
        engine = make_engine(f"sqlite:///{side.db}", create=False)
        with session_factory(engine, readonly=True)() as s:
            starts = {j.slurm_job_id: (j.start_time, j.restart_count)
                      for j in s.scalars(sql_select(Job).where(
                          Job.slurm_job_id.in_(sorted(emulated))))}
        engine.dispose()
        for job_id, (start, restarts) in starts.items():
            lines = spool_lines(side, job_id)
            run = [x for x in lines if x.get("event") == "started"
                   and x.get("restart") == restarts]
            if start is not None and run:
                startup.append(run[0]["t"] - start.timestamp())
            for a, b in zip(lines, lines[1:], strict=False):
                if a.get("event") == "checkpointed" and b.get("event") == "started":
                    requeue.append(b["t"] - a["t"])

    def med(xs: list[float]) -> float | None:
        xs = sorted(xs)
        return round(xs[len(xs) // 2], 3) if xs else None

    return {"startup_s": med(startup), "startup_n": len(startup),
            "requeue_s": med(requeue), "requeue_n": len(requeue),
            "sched_s": med(probes), "sched_n": len(probes),
            "first_start_s": med(first), "first_start_n": len(first)}


def audit(side: Side) -> dict:
    """No job lost or left held; every done requeue has the job's ``checkpointed`` line
    of the run it ended (restart count at the action's start, after its signal)."""
    from sqlalchemy import select as sql_select

    from malleable.db.engine import make_engine, session_factory
    from malleable.db.models import Action, Job

    ids = {r["job_id"] for r in side.records}
    engine = make_engine(f"sqlite:///{side.db}", create=False)
    requeues, unproven = 0, []
    with session_factory(engine, readonly=True)() as s:
        q = (sql_select(Job.slurm_job_id, Action)
             .join(Action, Action.job_id == Job.id)
             .where(Job.slurm_job_id.in_(sorted(ids)), Action.kind == "requeue",
                    Action.state == "done"))
        for job_id, a in s.execute(q):
            requeues += 1
            ok = any(x.get("event") == "checkpointed"
                     and x.get("restart") == a.restart_count_at_start
                     for x in spool_lines(side, job_id))
            if not ok:
                unproven.append(f"{job_id} (action {a.id})")
    engine.dispose()
    live = [j for j in side.client().jobs() if j.job_id in ids]
    held = [j.job_id for j in live if j.held]
    return {"requeues_done": requeues, "requeues_without_checkpoint": unproven,
            "held_at_end": held}


def predict(sides: list[Side], recipes: list[ReplayJob], speedup: float,
            measured: dict) -> dict:
    """The simulator's prediction of each side's run (`malleable.sim.predict`), with the
    restart cost and requeue latency measured on the clusters (`measured_startup`)."""
    from malleable.sim.predict import predict_replay

    startup = measured["startup_s"] if measured["startup_s"] is not None else 2.0
    out = {}
    for side in sides:
        config = load_config(str(side.root / "malleable.toml"))
        # A requeue on the cluster: the wait for the next poll (half an interval on
        # average, simulated), then Slurm and the daemon's calls, then the start-up.
        latency = 0.0
        if measured["requeue_s"] is not None:
            latency = max(0.0, measured["requeue_s"] - startup
                          - config.daemon.poll_interval_s / 2)
        r = predict_replay(recipes, config, speedup=speedup, nodes=4, gpus_per_node=4,
                           restart_cost_s=max(startup, 0.0), dry_run=side.dry_run,
                           requeue_latency_s=latency, sched_delay_s=measured["sched_s"] or 0.0)
        jobs = {o.name: (None if o.end_s is None else round(o.end_s - o.arrival_s, 3))
                for o in r.outcomes}
        jcts = [v for v in jobs.values() if v is not None]
        out[side.name] = {"avg_jct_s": round(sum(jcts) / len(jcts), 3) if jcts else None,
                          "jct_s": jcts, "jobs": jobs, "finished": r.finished,
                          "restarts": int(sum(o.restarts for o in r.outcomes))}
    return out


def summarize(jobs: list[dict], expected: int) -> dict:
    """Average JCT over all jobs and over the replayed trace jobs (the ones the
    simulator predicts: all but the real PyTorch job); jobs lost (not COMPLETED, or
    never seen by the daemon)."""
    def avg(js: list[dict]) -> float | None:
        jcts = [j["jct_s"] for j in js if j["jct_s"] is not None]
        return round(sum(jcts) / len(jcts), 3) if jcts else None

    return {"jobs": len(jobs), "finished": sum(1 for j in jobs if j["jct_s"] is not None),
            "avg_jct_s": avg(jobs), "avg_jct_replay_s": avg([j for j in jobs if not j["real"]]),
            "restarts": sum(j["restarts"] for j in jobs),
            "lost": [j["name"] for j in jobs if j["state"] != "COMPLETED"]
            + ([f"{expected - len(jobs)} never seen"] if len(jobs) < expected else [])}


def write_report(report: Path, sides: list[Side], results: dict, timelines: dict) -> None:
    from malleable.mpl import pyplot

    plt = pyplot()

    (report / "report.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    rows = ["side,name,job_id,model,state,restarts,jct_s"]
    for s in sides:
        for j in results[s.name]["jobs"]:
            rows.append(f"{s.name},{j['name']},{j['job_id']},{j['model']},{j['state']},"
                        f"{j['restarts']},{j['jct_s']}")
    (report / "jobs.csv").write_text("\n".join(rows) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in sides:
        jcts = sorted(j["jct_s"] for j in results[s.name]["jobs"]
                      if j["jct_s"] is not None and not j["real"])
        if jcts:
            ax.step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], where="post",
                    label=f"{s.name} ({s.policy}): avg {sum(jcts) / len(jcts):.0f} s")
    for name, pred in results.get("simulator", {}).items():
        if pred.get("jct_s"):
            jcts = sorted(pred["jct_s"])
            ax.step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], where="post",
                    linestyle="--", label=f"simulator, {name}: avg {pred['avg_jct_s']:.0f} s")
    ax.set_xlabel("job completion time (s, on the compressed clock)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT of the trace jobs on the harness: malleable vs static")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(report / "jct_cdf.png", dpi=120)
    plt.close(fig)
    fig, axes = plt.subplots(len(sides), 1, figsize=(7, 2.6 * len(sides)), squeeze=False)
    for ax, s in zip(axes[:, 0], sides, strict=True):
        series = timelines.get(s.name, {})
        names = sorted(series)
        if names:
            end = max(t for pts in series.values() for t, _ in pts)
            xs = sorted({0.0, end, *(t for pts in series.values() for t, _ in pts)})
            stacks = []
            for n in names:
                pts, k, i, ys = series[n], 0, 0, []
                for x in xs:
                    while i < len(pts) and pts[i][0] <= x:
                        k = pts[i][1]
                        i += 1
                    ys.append(k)
                stacks.append(ys)
            ax.stackplot(xs, stacks, step="post")
        ax.set_title(f"{s.name} ({s.policy}): GPUs per job over time", fontsize=9)
        ax.set_ylabel("GPUs")
        ax.set_ylim(0, 16)
    axes[-1, 0].set_xlabel("seconds since the first submission")
    fig.tight_layout()
    fig.savefig(report / "gpus_over_time.png", dpi=120)
    plt.close(fig)


def print_comparison(sides: list[Side], results: dict) -> None:
    """Per job: JCT measured on each side and the simulator's prediction; averages."""
    sim = results.get("simulator", {})
    names = sorted({j["name"] for s in sides for j in results[s.name]["jobs"]},
                   key=lambda n: (n != TORCH_NAME, n))
    by = {s.name: {j["name"]: j for j in results[s.name]["jobs"]} for s in sides}
    cols = [(s.name, "measured") for s in sides] + [(s.name, "simulated") for s in sides
                                                    if s.name in sim]
    head = "job".ljust(18) + "".join(f"{f'{n} {k}':>22}" for n, k in cols)
    print("\nJCT (s, on the compressed clock)")
    print(head)
    print("-" * len(head))

    def cell(v) -> str:
        return f"{v:>22.1f}" if v is not None else f"{'-':>22}"

    for n in names:
        row = n.ljust(18)
        for side, kind in cols:
            if kind == "measured":
                j = by[side].get(n)
                row += cell(j["jct_s"] if j else None)
            else:
                row += cell(sim[side]["jobs"].get(n))
        print(row)
    print("-" * len(head))
    row = "average (trace)".ljust(18)
    for side, kind in cols:
        row += cell(results[side]["summary"]["avg_jct_replay_s"] if kind == "measured"
                    else sim[side]["avg_jct_s"])
    print(row)
    if "ratio" in results:
        print(f"\naverage JCT of the trace jobs, malleable / static: {results['ratio']:.3f}"
              f" (goal <= 0.6)")
    for side in sim:
        err = results["sim_error"].get(side)
        if err is not None:
            print(f"simulator vs harness, {side}: {err:+.1%} (goal within 15%)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="the CI form: a few jobs, one side")
    ap.add_argument("--workload", default=str(WORKLOADS / "workload-1.csv"))
    ap.add_argument("--speedup", type=float, default=40.0,
                    help="time compression of arrivals and step times (default 40)")
    ap.add_argument("--dir", default="/tmp/malleable-demo", help="state of both sides")
    ap.add_argument("--report", default=str(ROOT / "demo-report"), help="report directory")
    ap.add_argument("--baseline", choices=("static", "plain"), default="static",
                    help="the second cluster: the daemon with the static policy (FIFO with "
                         "backfill at its decide interval, default), or plain Slurm observed "
                         "by a --dry-run daemon (Slurm's own backfill every 30 s)")
    ap.add_argument("--status-every", type=float, default=30.0,
                    help="seconds between live status views")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("demo: error: must run as root (the Slurm harnesses need it)", file=sys.stderr)
        return 2
    if not (args.speedup > 0):
        print(f"demo: error: --speedup={args.speedup}: expected a number > 0", file=sys.stderr)
        return 2
    root = Path(args.dir)
    # A random start: two demos (or a demo and the test suite's) started at the same
    # moment would otherwise both find the same free ports before either binds them.
    # Below 20000: the test suite's harnesses take random ports in 20000-40000, and
    # Linux's ephemeral ports start at 32768.
    base = free_port_block(12, 10000 + random.randrange(0, 400) * 24)
    sides = [Side("malleable", "default", root / "malleable", base)]
    if not args.short:
        sides.append(Side("static", "static", root / "static", base + 6,
                          dry_run=args.baseline == "plain"))
    trace = load_pollux_workload(args.workload)
    if args.short:
        chosen = select(trace, models=["cifar10", "ncf"], limit=4)
    else:
        # Every job of the four models with short-enough runs (imagenet and yolov3 train
        # for hours even on 16 GPUs) arriving in the trace's first 4 hours: 64 jobs,
        # about 10 minutes of arrivals and training at 40x.
        chosen = select(trace, models=list(DEMO_MODELS), until_s=DEMO_HOURS * 3600)
    recipes = [recipe(t, gpus_per_node=4, max_gpus=16, grace_s=30) for t in chosen]
    expected = len(recipes) + 1   # and the PyTorch job
    report = Path(args.report)
    report.mkdir(parents=True, exist_ok=True)
    (report / "recipes.json").write_text(json.dumps(recipes_as_dicts(recipes), indent=2))
    log(f"{len(recipes)} jobs of {Path(args.workload).name}, {args.speedup:g}x compressed, "
        f"and one PyTorch job, on {len(sides)} cluster(s)")
    t_start = time.monotonic()

    def stop(signum, frame):   # `kill` and a closed terminal clean up like Ctrl-C
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    failed = True   # until the run ends without problems: then Slurm's logs are not kept
    try:
        for s in sides:
            bring_up(s, 4, 4)
            write_config(s, poll_s=2, decide_s=4)
            start_daemon(s)
        try:
            probes = [x for s in sides for x in probe_start_latency(s)]
        except RuntimeError as exc:
            log(f"error: {exc}")
            return 1
        log(f"Slurm starts a job that fits {sorted(probes)[len(probes) // 2]:.2f} s after its "
            f"submission (median of {len(probes)} probe jobs)")
        for s in sides:
            submit_torch_job(s)
        errors: list[str] = []
        threads = [threading.Thread(target=run_replay, args=(s, recipes, args.speedup, errors),
                                    daemon=True) for s in sides]
        for t in threads:
            t.start()
        deadline = time.monotonic() + (600 if args.short else 3600)
        last_view = 0.0
        while time.monotonic() < deadline:
            time.sleep(5)
            try:
                states = {s.name: jobs_done(s) for s in sides}
                if time.monotonic() - last_view >= args.status_every:
                    show_status(sides, expected, states)
                    last_view = time.monotonic()
            except RuntimeError as exc:
                errors.append(str(exc))
                break
            if errors or any(s.daemon is not None and s.daemon.poll() is not None
                             for s in sides):
                break
            if all(d == n == expected for d, n in states.values()):
                break
        for t in threads:
            t.join(timeout=5)
        for s in sides:
            if s.daemon is not None and s.daemon.poll() is not None:
                errors.append(f"the daemon of side {s.name} exited with "
                              f"{s.daemon.returncode}: see {s.root}/daemon.log")
        if errors:
            for e in errors:
                log(f"error: {e}")
            return 1
        for s in sides:
            wait_recorded(s, expected)
        results: dict = {"workload": Path(args.workload).name, "speedup": args.speedup,
                         "jobs": len(recipes), "real_jobs": [TORCH_NAME]}
        timelines = {}
        for s in sides:
            stop_daemon(s)
            jobs = collect(s)
            results[s.name] = {"policy": s.policy, "jobs": jobs,
                               "summary": summarize(jobs, expected), "audit": audit(s)}
            timelines[s.name] = gpu_timeline(s)
        if len(sides) == 2:
            a = results["malleable"]["summary"]["avg_jct_replay_s"]
            b = results["static"]["summary"]["avg_jct_replay_s"]
            if a and b:
                results["ratio"] = round(a / b, 4)
        costs = measured_startup(sides, probes)
        results["measured"] = costs
        log(f"simulating the run{'s' if len(sides) > 1 else ''} with the costs measured on "
            f"the harness: start-up {costs['startup_s']} s ({costs['startup_n']} runs), "
            f"checkpoint to restart {costs['requeue_s']} s ({costs['requeue_n']} requeues), "
            f"Slurm's submission to start {costs['sched_s']} s")
        results["simulator"] = predict(sides, recipes, args.speedup, costs)
        results["sim_error"] = {}
        for s in sides:
            real = results[s.name]["summary"]["avg_jct_replay_s"]
            pred = results["simulator"][s.name]["avg_jct_s"]
            results["sim_error"][s.name] = round((pred - real) / real, 4) if real and pred \
                else None
        results["wall_s"] = round(time.monotonic() - t_start, 1)
        write_report(report, sides, results, timelines)
        print_comparison(sides, results)
        problems = []
        for s in sides:
            summ, aud = results[s.name]["summary"], results[s.name]["audit"]
            log(f"side {s.name}: {summ['finished']}/{summ['jobs']} jobs finished, "
                f"{summ['restarts']} restarts, {aud['requeues_done']} requeues, "
                f"each after its checkpoint: {not aud['requeues_without_checkpoint']}, "
                f"held at the end: {len(aud['held_at_end'])}")
            if summ["lost"]:
                problems.append(f"side {s.name}: jobs lost: {', '.join(summ['lost'])}")
            if aud["requeues_without_checkpoint"] or aud["held_at_end"]:
                problems.append(f"side {s.name}: audit failed: {aud}")
        log(f"report: {report}/report.json, jobs.csv, jct_cdf.png, gpus_over_time.png "
            f"({results['wall_s']:.0f} s)")
        for p in problems:
            log(f"error: {p}")
        failed = bool(problems)
        return 1 if problems else 0
    finally:
        for s in sides:
            stop_daemon(s)
            if failed and (s.harness_dir / "log").is_dir():   # `down` removes them
                kept = report / f"slurm-log-{s.name}"
                shutil.copytree(s.harness_dir / "log", kept, dirs_exist_ok=True)
                log(f"side {s.name}: Slurm's logs kept in {kept}")
            harness("down", "--dir", str(s.harness_dir))
        log("daemons stopped, harnesses down")


if __name__ == "__main__":
    sys.exit(main())
