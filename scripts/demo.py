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
    if side.harness_dir.exists():
        harness("down", "--dir", str(side.harness_dir))
    side.root.mkdir(parents=True, exist_ok=True)
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
        return 0
    finally:
        for s in sides:
            stop_daemon(s)
            harness("down", "--dir", str(s.harness_dir))
        log("daemons stopped, harnesses down")


if __name__ == "__main__":
    sys.exit(main())
