#!/usr/bin/env python3
"""The end-to-end demo: malleable against plain Slurm on two real local clusters.

``make demo`` runs this with the project's venv. It:

1. brings up two Slurm harnesses of 4 nodes x 4 fake GPUs, each with its own
   ports and directory: side ``malleable`` and side ``static``;
2. starts ``malleable daemon`` on each, with the default policy on one and the
   ``static`` policy (no reallocation: plain Slurm behaviour) on the other;
3. replays the same subset of a Pollux workload (derived from Microsoft's
   Philly trace) onto both at the same time with `malleable replay`'s recipe,
   time-compressed (30x by default): each job an emulated job following its
   model's measured T4 profile, plus one real PyTorch job on each side;
4. shows a live status table while they run;
5. when every job has ended, prints the per-job and average JCT of both sides,
   their ratio, and the simulator's prediction of both runs; writes a report
   directory (report.json, jobs.csv, plots);
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

from malleable.config import SlurmConfig  # noqa: E402
from malleable.replay import ReplayJob, recipe, recipes_as_dicts, replay, select  # noqa: E402
from malleable.sim.traces import load_pollux_workload  # noqa: E402
from malleable.slurm import connect  # noqa: E402

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
default_restart_cost_s = 10
""")


def start_daemon(side: Side) -> None:
    with open(side.root / "daemon.log", "w") as out:  # the child keeps its own descriptor
        side.daemon = subprocess.Popen([str(VENV_BIN / "malleable"), "daemon"], env=side.env,
                                       stdout=out, stderr=subprocess.STDOUT, cwd=side.root)
    log(f"side {side.name}: daemon started (policy {side.policy}, log {side.root}/daemon.log)")


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
        side.records = replay(side.client(), recipes, script=str(ROOT / "examples/emulated_job.sbatch"),
                              speedup=speedup, spool_dir=str(side.spool), gpus_per_node=4,
                              log_path=str(side.root / "replay.jsonl"), extra_env=job_env(side),
                              workdir=str(side.root / "work"))
    except Exception as exc:  # reported by the main thread
        errors.append(f"replay on {side.name}: {exc}")


def jobs_done(side: Side, expected: int) -> tuple[int, int]:
    """(finished, total submitted) of the side's replayed jobs, from Slurm."""
    if len(side.records) < expected:
        return 0, len(side.records)
    client = side.client()
    ids = {r["job_id"] for r in side.records}
    done = sum(1 for j in client.jobs() if j.job_id in ids and j.state.finished)
    return done, len(ids)


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
                        "state": job.state, "restarts": job.restart_count,
                        "jct_s": None if end is None else round(end - start, 3),
                        "attained_gpu_s": round(job.attained_gpu_s or 0.0, 1)})
    engine.dispose()
    return sorted(out, key=lambda r: r["name"])


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


def summarize(jobs: list[dict]) -> dict:
    jcts = [j["jct_s"] for j in jobs if j["jct_s"] is not None]
    return {"jobs": len(jobs), "finished": len(jcts),
            "avg_jct_s": round(sum(jcts) / len(jcts), 3) if jcts else None,
            "restarts": sum(j["restarts"] for j in jobs),
            "lost": [j["name"] for j in jobs if j["state"] != "COMPLETED"]}


def write_report(report: Path, sides: list[Side], results: dict, timelines: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (report / "report.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    rows = ["side,name,job_id,model,state,restarts,jct_s"]
    for s in sides:
        for j in results[s.name]["jobs"]:
            rows.append(f"{s.name},{j['name']},{j['job_id']},{j['model']},{j['state']},"
                        f"{j['restarts']},{j['jct_s']}")
    (report / "jobs.csv").write_text("\n".join(rows) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in sides:
        jcts = sorted(j["jct_s"] for j in results[s.name]["jobs"] if j["jct_s"] is not None)
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
    ax.set_title("JCT on the harness: malleable vs plain Slurm")
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
    names = sorted({j["name"] for s in sides for j in results[s.name]["jobs"]})
    by = {s.name: {j["name"]: j for j in results[s.name]["jobs"]} for s in sides}
    head = "job".ljust(18) + "".join(f"{s.name + ' JCT (s)':>20}" for s in sides)
    print(head)
    print("-" * len(head))
    for n in names:
        cells = []
        for s in sides:
            j = by[s.name].get(n)
            jct = j and j["jct_s"]
            cells.append(f"{jct:>20.1f}" if jct is not None else f"{'-':>20}")
        print(n.ljust(18) + "".join(cells))
    print("-" * len(head))
    print("average".ljust(18) + "".join(
        f"{results[s.name]['summary']['avg_jct_s'] or float('nan'):>20.1f}" for s in sides))
    if "ratio" in results:
        print(f"\naverage JCT, malleable / static: {results['ratio']:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="the CI form: a few jobs, one side")
    ap.add_argument("--workload", default=str(WORKLOADS / "workload-1.csv"))
    ap.add_argument("--speedup", type=float, default=30.0)
    ap.add_argument("--dir", default="/tmp/malleable-demo", help="state of both sides")
    ap.add_argument("--report", default=str(ROOT / "demo-report"), help="report directory")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("demo: error: must run as root (the Slurm harnesses need it)", file=sys.stderr)
        return 2
    root = Path(args.dir)
    base = free_port_block(12, 21000)
    sides = [Side("malleable", "default", root / "malleable", base)]
    if not args.short:
        sides.append(Side("static", "static", root / "static", base + 6))
    trace = load_pollux_workload(args.workload)
    if args.short:
        chosen = select(trace, models=["cifar10", "ncf"], limit=4)
    else:
        chosen = select(trace, models=["cifar10", "ncf", "bert", "deepspeech2"], every=4,
                        until_s=4 * 3600)
    recipes = [recipe(t, gpus_per_node=4, max_gpus=16, grace_s=30) for t in chosen]
    report = Path(args.report)
    report.mkdir(parents=True, exist_ok=True)
    (report / "recipes.json").write_text(json.dumps(recipes_as_dicts(recipes), indent=2))
    log(f"{len(recipes)} jobs of {Path(args.workload).name}, {args.speedup:g}x compressed")
    try:
        for s in sides:
            bring_up(s, 4, 4)
            write_config(s, poll_s=2, decide_s=4)
            start_daemon(s)
        errors: list[str] = []
        threads = [threading.Thread(target=run_replay, args=(s, recipes, args.speedup, errors))
                   for s in sides]
        for t in threads:
            t.start()
        deadline = time.monotonic() + (600 if args.short else 3600)
        while time.monotonic() < deadline:
            time.sleep(10)
            states = {s.name: jobs_done(s, len(recipes)) for s in sides}
            log("  ".join(f"{n}: {d}/{len(recipes)} done" for n, (d, _) in states.items()))
            if errors:
                break
            if all(d == len(recipes) for d, _ in states.values()):
                break
        for t in threads:
            t.join(timeout=5)
        if errors:
            for e in errors:
                log(f"error: {e}")
            return 1
        results: dict = {"workload": Path(args.workload).name, "speedup": args.speedup,
                         "jobs": len(recipes)}
        timelines = {}
        for s in sides:
            stop_daemon(s)
            jobs = collect(s)
            results[s.name] = {"policy": s.policy, "jobs": jobs, "summary": summarize(jobs)}
            timelines[s.name] = gpu_timeline(s)
        if len(sides) == 2:
            a = results["malleable"]["summary"]["avg_jct_s"]
            b = results["static"]["summary"]["avg_jct_s"]
            if a and b:
                results["ratio"] = round(a / b, 4)
        write_report(report, sides, results, timelines)
        print_comparison(sides, results)
        log(f"report: {report}/report.json, jobs.csv, jct_cdf.png, gpus_over_time.png")
        complete = all(not results[s.name]["summary"]["lost"] for s in sides)
        return 0 if complete else 1
    finally:
        for s in sides:
            stop_daemon(s)
            harness("down", "--dir", str(s.harness_dir))
        log("daemons stopped, harnesses down")


if __name__ == "__main__":
    sys.exit(main())
