"""Speed of the simulator running the daemon's full decision loop.

Two measurements, each one run in this process (no parallel runs, so the
figures are per run):

1. One Pollux workload of 160 jobs (default workload-1) on 16 nodes x 4 GPUs,
   with the production cycle (poll, ingest, estimators, policy, reconciler,
   actuator) every 60 simulated seconds, for each policy. Targets: under 20 s
   of wall time for every policy but ``pollux``, under 2 minutes for ``pollux``.
2. The Philly list's busiest 2-week window on 64 GPUs (target: under 10
   minutes; stopped after ``--philly-limit`` seconds, default 900, and then
   reported as how far it got). Definition (`malleable.sim.workloads.busiest_fitting_window`):
   the whole list after Pollux's filters asks for about 9.5 times what 64 GPUs
   can serve in its busiest two weeks, so a run of it measures an ever-growing
   queue, not a cluster. Instead: among the 2-week windows of arrivals of each
   Philly virtual cluster (a tenant's own stream of jobs), the one whose
   demand is the largest that 64 GPUs can serve on average (demand: each job's
   GPUs times its isolated training time at its request, as simulated). Jobs
   are the loader's (`malleable.sim.traces.load_philly`: Pollux's filters, a
   model by GPU-time class, seed 0).
3. For comparison, the whole list's busiest 2-week window (all virtual
   clusters together, the most demand; `busiest_fitting_window` with
   ``by_group=False`` and no capacity bound) with the same policy, stopped
   after ``--whole-limit`` seconds of wall time (default 900): printed are its
   wall time if it finished, else how far it got (simulated hours, jobs
   ended) when stopped.

Printed per run: jobs, simulated hours, wall seconds, decide cycles, wall
milliseconds per simulated minute and per decide cycle, the wall time of
the poll, ingest and decide cycles, and the first 16 hex digits of the run's
``decisions_sha256`` (to check that a speed-up left every decision alone). The machine is shared with other
engineers' test runs (its load average is printed with the results).

Usage:
  python benchmarks/bench_sim_speed.py [--policies static,las,...] [--workload PATH]
      [--philly PATH] [--philly-policy NAME] [--skip-philly] [--skip-workload]
      [--skip-whole] [--whole-limit S] [--philly-limit S]
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from machine import reference_line  # noqa: E402

from malleable.config import parse_config  # noqa: E402
from malleable.policies.registry import DEFAULT, POLICIES  # noqa: E402
from malleable.sim.jobsetup import setup_for  # noqa: E402
from malleable.sim.loop import SimOptions, run_simulation  # noqa: E402
from malleable.sim.traces import load_philly, load_pollux_workload  # noqa: E402
from malleable.sim.workloads import (  # noqa: E402
    PHILLY_MAX_GPU_TIME_S,
    PHILLY_MIN_DURATION_S,
    busiest_fitting_window,
    isolated_demand,
)

TARGET_S = {"pollux": 120.0}
DEFAULT_TARGET_S = 20.0


class Stopped(Exception):
    """A run stopped at its wall-time limit: how far it got."""

    def __init__(self, sim_s: float, ended: int, total: int, wall_s: float):
        super().__init__(f"stopped after {wall_s:.0f} s")
        self.sim_s, self.ended, self.total, self.wall_s = sim_s, ended, total, wall_s


def one(name: str, jobs, policy: str, *, nodes: int = 16, gpn: int = 4,
        max_time_s: float = 120 * 86400.0, wall_limit_s: float = math.inf) -> dict:
    """One run; raises `Stopped` once its wall time passes ``wall_limit_s``
    (checked after every decide cycle)."""
    config = parse_config({"policy": {"name": policy}}, source="bench")
    opts = SimOptions(nodes=nodes, gpus_per_node=gpn, restart_cost_s=30.0,
                      setup=setup_for(policy), max_time_s=max_time_s)
    t0 = time.perf_counter()
    count = [0]

    def progress(now: float, ended: int, total: int) -> None:
        count[0] += 1
        wall = time.perf_counter() - t0
        if count[0] % 2000 == 0:
            print(f"    ... {now / 3600:.0f} h simulated, {ended}/{total} jobs ended, "
                  f"{wall:.0f} s", flush=True)
        if wall > wall_limit_s:
            raise Stopped(now, ended, total, wall)

    r = run_simulation(jobs, config, opts, progress=progress)
    wall = time.perf_counter() - t0
    c = r.cycles
    minutes = max(r.sim_s / 60.0, 1.0)
    row = {"name": name, "policy": policy, "jobs": len(jobs), "finished": r.summary["jobs_finished"],
           "sim_h": r.sim_s / 3600.0, "wall_s": wall, "decides": c.decides,
           "ms_per_sim_min": wall / minutes * 1e3, "ms_per_decide": c.wall_s["decide"] / max(
               c.decides, 1) * 1e3, "poll_s": c.wall_s["poll"], "ingest_s": c.wall_s["ingest"],
           "decide_s": c.wall_s["decide"], "polls": c.polls, "ingests": c.ingests,
           "avg_jct_s": r.summary["avg_jct_s"], "sha": r.summary["decisions_sha256"]}
    print(f"{name:22s} {policy:8s} jobs={row['jobs']:5d} finished={row['finished']:5d} "
          f"sim={row['sim_h']:7.1f}h wall={wall:8.1f}s decides={c.decides:6d} "
          f"polls={c.polls:6d} ingests={c.ingests:6d} "
          f"ms/sim-min={row['ms_per_sim_min']:6.1f} ms/decide={row['ms_per_decide']:6.1f} "
          f"[poll {row['poll_s']:.1f}s ingest {row['ingest_s']:.1f}s "
          f"decide {row['decide_s']:.1f}s] avg_jct={row['avg_jct_s']:.0f}s "
          f"decisions_sha256={row['sha'][:16]}", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--workload",
                    default=str(ROOT / "malleable/sim/data/pollux/workloads/workload-1.csv"))
    ap.add_argument("--philly", default="/work/shared/data/philly_pollux/philly.csv")
    ap.add_argument("--philly-policy", default="default")
    ap.add_argument("--skip-philly", action="store_true")
    ap.add_argument("--skip-whole", action="store_true")
    ap.add_argument("--whole-limit", type=float, default=900.0)
    ap.add_argument("--philly-limit", type=float, default=900.0)
    ap.add_argument("--skip-workload", action="store_true")
    args = ap.parse_args()
    logging.getLogger("malleable").setLevel(logging.ERROR)
    print(f"# {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, {os.cpu_count()}-core machine, "
          f"nice {os.nice(0)}; load average at start {os.getloadavg()[0]:.2f} (a load "
          f"above 1 means other work shared the cores: wall times are then upper bounds)")
    print(reference_line())
    verdicts = []
    if not args.skip_workload:
        jobs = load_pollux_workload(args.workload)
        print(f"workload {Path(args.workload).name}: {len(jobs)} jobs, 16 nodes x 4 GPUs, "
              f"decide every 60 s, poll and ingest every 30 s (daemon defaults)")
        for pol in [p for p in args.policies.split(",") if p]:
            row = one(Path(args.workload).stem, jobs, pol)
            target = TARGET_S.get(pol, DEFAULT_TARGET_S)
            verdicts.append(f"{Path(args.workload).stem} {pol}: {row['wall_s']:.1f} s "
                            f"(target < {target:.0f} s: "
                            f"{'met' if row['wall_s'] < target else 'MISSED'})")
    pname = args.philly_policy + (f" (= {DEFAULT})" if args.philly_policy == "default" else "")
    if not (args.skip_philly and args.skip_whole):
        t0 = time.perf_counter()
        jobs = load_philly(args.philly, seed=0, min_duration_s=PHILLY_MIN_DURATION_S,
                           max_gpu_time_s=PHILLY_MAX_GPU_TIME_S)
    if not args.skip_philly:
        vc, start, window = busiest_fitting_window(
            jobs, 14 * 86400.0, 64.0, demand=lambda j: isolated_demand(j, 4, 64))
        demand = sum(isolated_demand(j, 4, 64) for j in window) / (14 * 86400.0)
        print(f"philly: {len(jobs)} jobs after Pollux's filters; busiest 2-week window that "
              f"fits 64 GPUs: virtual cluster {vc}, from day {start / 86400:.1f}, "
              f"{len(window)} jobs, demand {demand:.1f} GPUs on average "
              f"(selected in {time.perf_counter() - t0:.1f} s)")
        try:
            row = one(f"philly-{vc}-14d", window, args.philly_policy,
                      wall_limit_s=args.philly_limit)
            verdicts.append(f"philly busiest fitting 2-week window, {pname}: "
                            f"{row['wall_s']:.0f} s (target < 600 s: "
                            f"{'met' if row['wall_s'] < 600 else 'MISSED'})")
        except Stopped as s:
            print(f"philly-{vc}-14d   {args.philly_policy}: STOPPED at {s.wall_s:.0f} s of wall "
                  f"time: {s.sim_s / 3600:.1f} h simulated, {s.ended}/{s.total} jobs ended",
                  flush=True)
            verdicts.append(f"philly busiest fitting 2-week window, {pname}: did not finish "
                            f"in {args.philly_limit:.0f} s of wall time (target < 600 s: "
                            f"MISSED); stopped at {s.sim_s / 3600:.1f} of 336 simulated hours "
                            f"with {s.ended}/{s.total} jobs ended")
    if not args.skip_whole:
        t0 = time.perf_counter()
        _, start, window = busiest_fitting_window(
            jobs, 14 * 86400.0, math.inf, demand=lambda j: isolated_demand(j, 4, 64),
            by_group=False)
        demand = sum(isolated_demand(j, 4, 64) for j in window) / (14 * 86400.0)
        print(f"philly whole list: busiest 2-week window (all virtual clusters) from day "
              f"{start / 86400:.1f}, {len(window)} jobs, demand {demand:.1f} GPUs on average "
              f"({demand / 64:.1f}x the cluster; selected in {time.perf_counter() - t0:.1f} s); "
              f"stopped after {args.whole_limit:.0f} s of wall time if not finished")
        try:
            row = one("philly-all-14d", window, args.philly_policy,
                      wall_limit_s=args.whole_limit)
            verdicts.append(f"philly whole list's busiest 2-week window, {pname}: "
                            f"{row['wall_s']:.0f} s, {row['finished']}/{row['jobs']} jobs "
                            f"finished in {row['sim_h']:.0f} simulated hours")
        except Stopped as s:
            print(f"philly-all-14d          {args.philly_policy}: STOPPED at {s.wall_s:.0f} s "
                  f"of wall time: {s.sim_s / 3600:.1f} h simulated, {s.ended}/{s.total} jobs "
                  f"ended", flush=True)
            verdicts.append(f"philly whole list's busiest 2-week window, {pname}: did not "
                            f"finish in {args.whole_limit:.0f} s of wall time; stopped at "
                            f"{s.sim_s / 3600:.1f} simulated hours with {s.ended}/{s.total} "
                            f"jobs ended")
    print(f"# load average at end {os.getloadavg()[0]:.2f}")
    print(reference_line())
    for v in verdicts:
        print(v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
