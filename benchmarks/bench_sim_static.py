"""Benchmark: the simulator's pieces under the test-only static driver (plain Slurm).

For each workload: replay it into SimSlurm with simulated jobs from the Pollux
profiles, poll Slurm every --interval simulated seconds (the static driver of
tests/sim/static_driver.py: no policy, no estimator), run until every job ends,
and print wall time, simulated time, events, RPCs, progress lines written and
the average JCT. This measures the simulator alone; the daemon's cycle will add
its own cost on top.

Usage:
  python benchmarks/bench_sim_static.py [--workloads DIR] [--spool] [--philly-window]
  --spool          write progress files (to a temporary directory) as in a full run
                   (Pollux workloads only: the Philly window would write ~10 M lines)
  --philly-window  also replay the first --philly-days days of arrivals of the Philly
                   list's busiest 2-week window (Pollux's filters, seed 0) on 16 x 4 GPUs
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from malleable.sim.profiles import DATA_DIR, MODELS, load_profile  # noqa: E402
from malleable.sim.traces import busiest_window, load_philly, load_pollux_workload  # noqa: E402
from tests.sim.static_driver import run_static  # noqa: E402


def one(name: str, jobs, *, spool: bool, nodes: int, gpn: int, interval: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sp = Path(tmp) / "spool" if spool else None
        if sp is not None:
            sp.mkdir()
        t0 = time.perf_counter()
        run = run_static(jobs, Path(tmp), nodes=nodes, gpus_per_node=gpn, interval_s=interval,
                         spool_dir=sp, max_time_s=365 * 86400.0)
        wall = time.perf_counter() - t0
        lines = sum(1 for f in sp.glob("*.jsonl") for _ in f.open()) if sp else 0
    s = run.summary
    print(f"{name:28s} jobs={s['jobs']:5d} finished={s['jobs_finished']:5d} "
          f"wall={wall:7.2f}s sim={run.engine.now / 3600:8.1f}h "
          f"speedup={run.engine.now / wall:9.0f}x events={run.engine.events_processed:8d} "
          f"cycles={run.cycles:6d} rpcs={run.slurm.rpc_count:7d} lines={lines:7d} "
          f"avg_jct={s['avg_jct_s']:9.0f}s util={s['gpu_utilization']:.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=str(DATA_DIR / "workloads"))
    ap.add_argument("--spool", action="store_true")
    ap.add_argument("--interval", type=float, default=60.0)
    ap.add_argument("--philly-window", action="store_true")
    ap.add_argument("--philly", default="/work/shared/data/philly_pollux/philly.csv")
    ap.add_argument("--philly-days", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    args = ap.parse_args()
    t0 = time.perf_counter()
    for m in MODELS:
        load_profile(m)
    print(f"profiles loaded in {time.perf_counter() - t0:.2f}s (once per process)")
    print(f"cluster 16 nodes x 4 GPUs, interval {args.interval:.0f}s, "
          f"progress files: {'yes' if args.spool else 'no'}")
    for path in sorted(Path(args.workloads).glob("workload-*.csv")):
        one(f"{Path(args.workloads).name}/{path.stem}", load_pollux_workload(path),
            spool=args.spool, nodes=16, gpn=4, interval=args.interval)
    if args.philly_window:
        t0 = time.perf_counter()
        jobs = load_philly(args.philly, seed=0, min_duration_s=60, max_gpu_time_s=3.6e6)
        start, window = busiest_window(jobs, 14 * 86400.0)
        print(f"philly: {len(jobs)} jobs after Pollux's filters; busiest 14 days start at "
              f"day {start / 86400:.1f} with {len(window)} jobs "
              f"({sum(j.gpu_time_s for j in window) / (14 * 86400):.0f} GPUs of demand on "
              f"average); loaded in {time.perf_counter() - t0:.1f}s")
        for days in args.philly_days:
            part = [j for j in window if j.arrival_s < days * 86400]
            one(f"philly-busiest-first-{days:g}d", part, spool=False, nodes=16, gpn=4,
                interval=args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
