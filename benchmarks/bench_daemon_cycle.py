#!/usr/bin/env python3
"""Benchmark of the daemon's decide cycle: time and Slurm RPCs for 200, 1,000 and 5,000 jobs.

The production `Daemon` (poll, ingest, estimators, policy, reconciler, actuator)
runs against the simulator's Slurm (`malleable.sim.slurm.SimSlurm`, 64 nodes x 4
GPUs) on virtual time, with a real SQLite state store in a temporary directory.
A share of the jobs is malleable (`ProfileJob`s of the Pollux profiles writing
progress lines to the spool), the rest rigid one-to-four-GPU jobs; most of them
pend, as on a busy cluster.

For each size it prints: jobs Slurm lists, malleable jobs the policy allocated,
then for the first decide cycle (cold: estimator state built from scratch, the
first actions) and for the steady state (the mean of the next cycles, a minute of
virtual time apart): wall time, the policy's own time, and RPCs split into the
poll, node-list reads and action calls. The claim it checks by printing: a cycle
costs one ``jobs()`` RPC plus one per action.

Usage:
    python benchmarks/bench_daemon_cycle.py [--sizes 200 1000 5000] [--malleable 0.2]
        [--policy equi] [--steady 3]
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

from malleable.config import parse_config
from malleable.daemon.cycle import CycleReport, Daemon
from malleable.db import schema
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Decision
from malleable.sim.engine import Engine
from malleable.sim.jobs import ProfileJob, RigidJob
from malleable.sim.profiles import load_profile
from malleable.sim.slurm import SimSlurm
from malleable.slurm.records import SubmitRequest

NODES, GPUS_PER_NODE = 64, 4
MODELS = ("cifar10", "bert", "ncf", "yolov3")


def build(n: int, share: float, policy: str, tmp: Path, seed: int) -> tuple[Daemon, Engine]:
    rng = random.Random(seed)
    engine = Engine()
    slurm = SimSlurm(engine, nodes=NODES, gpus_per_node=GPUS_PER_NODE)
    spool = tmp / "spool"
    spool.mkdir()
    db = make_engine(f"sqlite:///{tmp}/m.db")
    schema.prepare_schema(db)
    config = parse_config({"progress": {"spool_dir": str(spool)},
                           "policy": {"name": policy, "min_gain": 0.0, "cooldown_s": 0.0,
                                      "min_run_restarts": 0.0},
                           "daemon": {"poll_interval_s": 30.0, "decide_interval_s": 60.0}})
    daemon = Daemon(slurm=slurm, sessions=session_factory(db), clock=engine.datetime_at,
                    spool_dir=str(spool), config=config)
    for i in range(n):
        if rng.random() < share:
            model = MODELS[i % len(MODELS)]
            g = rng.choice((1, 2, 4))
            program = ProfileJob(load_profile(model), spool_dir=spool)
            comment = (f"malleable:gpus=1-8,grace=60,batch={program.profile.default_batch(g)},"
                       f"model={model}")
        else:
            g = rng.choice((1, 1, 2, 4))
            program, comment = RigidJob(rng.uniform(3600, 36000)), ""
        slurm.submit_sim(SubmitRequest(script="/bin/true", nodes=1, gpus_per_node=g,
                                       comment=comment, requeue=True), program)
    engine.run(until=120.0)
    return daemon, engine


def policy_s(daemon: Daemon, decision_id: int | None) -> float:
    if decision_id is None:
        return float("nan")
    with daemon.sessions() as s:
        return float(s.scalar(select(Decision.duration_s).where(Decision.id == decision_id)))


def row(label: str, reports: list[CycleReport], daemon: Daemon) -> str:
    k = len(reports)
    wall = sum(r.duration_s for r in reports) / k
    pol = sum(policy_s(daemon, r.decision_id) for r in reports) / k
    rpc = sum(r.rpc for r in reports) / k
    poll = sum(r.rpc_poll for r in reports) / k
    nodes = sum(r.rpc_nodes for r in reports) / k
    acts = sum(r.drive.rpc_count for r in reports) / k
    calls: dict[str, int] = {}
    for r in reports:
        for m, c in r.drive.calls.items():
            calls[m] = calls.get(m, 0) + c
    ok = all(r.rpc == r.rpc_poll + r.rpc_nodes + r.drive.rpc_count and r.rpc_poll == 1
             for r in reports)
    detail = ", ".join(f"{m} {c}" for m, c in sorted(calls.items())) or "-"
    return (f"  {label:<8} {wall * 1e3:9.1f} ms  policy {pol * 1e3:7.1f} ms  RPCs {rpc:6.1f} "
            f"= jobs {poll:.0f} + nodes {nodes:.0f} + actions {acts:.1f} [{detail}]"
            f"  {'one jobs() + one per action' if ok else 'MISMATCH'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[200, 1000, 5000])
    ap.add_argument("--malleable", type=float, default=0.2, help="share of malleable jobs")
    ap.add_argument("--policy", default="equi")
    ap.add_argument("--steady", type=int, default=3, help="steady-state cycles averaged")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    print(f"# bench_daemon_cycle: {NODES} nodes x {GPUS_PER_NODE} GPUs (SimSlurm), "
          f"{args.malleable:.0%} malleable, policy {args.policy}, SQLite store; "
          f"Python {platform.python_version()}, {platform.machine()}")
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix="bench-daemon-") as tmp:
            daemon, engine = build(n, args.malleable, args.policy, Path(tmp), args.seed)
            t0 = time.perf_counter()
            daemon.poll_cycle()
            daemon.refresh_nodes(engine.datetime_at(), force=True)
            first = daemon.decide_cycle()
            steady = []
            for _ in range(args.steady):
                engine.run(until=engine.now + 60.0)
                steady.append(daemon.decide_cycle())
            total = time.perf_counter() - t0
            listed = first.jobs
            running = sum(j.state.value == "RUNNING" for j in daemon.observed.values())
            print(f"{n} jobs: {listed} listed, {running} running, {first.managed} malleable "
                  f"allocated ({total:.1f} s for {1 + args.steady} decide cycles + 1 poll)")
            print(row("first", [first], daemon))
            print(row("steady", steady, daemon))
    return 0


if __name__ == "__main__":
    sys.exit(main())
