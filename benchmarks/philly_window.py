"""The Philly busiest 2-week window run whole with one policy: its JCT metrics and times.

`bench_sim_speed.py` times this run and stops it at a wall-time limit; this script
runs it to the end (every job finished) and prints the scalar fields of the run's
`summary.json` (average, median and p99 JCT, makespan, GPU utilization, restarts per
job, finish-time fairness, the decisions digest), with its wall and CPU time. It is the
measurement for a change that alters decisions under overload: run it from this
checkout and from a worktree of the revision before the change (``git worktree add
/tmp/base REV``; ``python /tmp/base/benchmarks/philly_window.py``), and compare.
(For a revision older than this script, copy it into that worktree: it uses only
the simulator's API of 2026-12-07 and before.) The window, jobs and
options are `bench_sim_speed.py`'s (16 nodes x 4 GPUs, 30 s restart cost, the
daemon's defaults).

usage (from a checkout):
    python benchmarks/philly_window.py [--policy default] [--philly PATH]
        [--queue-depth N]

A progress line every 2,000 decide cycles (about 33 simulated hours). It takes 15
to 30 minutes on the 2-core machine (benchmarks/results/philly_window.txt).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from machine import reference_line  # noqa: E402
from philly import DEFAULT_PATH, busiest_window  # noqa: E402

from malleable.config import parse_config  # noqa: E402
from malleable.policies.registry import POLICIES  # noqa: E402
from malleable.sim.jobsetup import setup_for  # noqa: E402
from malleable.sim.loop import SimOptions, run_simulation  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="default", help="a policy name (default: default)")
    ap.add_argument("--philly", default=DEFAULT_PATH)
    ap.add_argument("--queue-depth", type=int, default=None,
                    help="policy.queue_depth (default: the configuration's default)")
    args = ap.parse_args()
    if args.policy not in POLICIES and args.policy != "default":
        ap.error(f"--policy {args.policy!r}: expected one of default, {', '.join(POLICIES)}")
    policy: dict = {"name": args.policy}
    if args.queue_depth is not None:
        if not 0 <= args.queue_depth <= 1_000_000:
            ap.error(f"--queue-depth {args.queue_depth}: expected an integer from 0 to "
                     f"1000000")
        policy["queue_depth"] = args.queue_depth
    if not Path(args.philly).is_file():
        ap.error(f"--philly {args.philly}: no such file")
    logging.getLogger("malleable").setLevel(logging.ERROR)
    vc, start, window = busiest_window(args.philly)
    print(reference_line())
    print(f"# philly busiest fitting 2-week window: virtual cluster {vc}, from day "
          f"{start / 86400:.1f}, {len(window)} jobs; 16 nodes x 4 GPUs, policy {policy}",
          flush=True)
    config = parse_config({"policy": policy}, source="philly_window")
    opts = SimOptions(nodes=16, gpus_per_node=4, restart_cost_s=30.0,
                      setup=setup_for(args.policy), max_time_s=120 * 86400.0)
    t0, c0, count = time.perf_counter(), time.process_time(), [0]

    def progress(now: float, ended: int, total: int) -> None:
        count[0] += 1
        if count[0] % 2000 == 0:
            print(f"    ... {now / 3600:.0f} h simulated, {ended}/{total} jobs ended, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)

    r = run_simulation(window, config, opts, progress=progress)
    print(json.dumps({k: v for k, v in r.summary.items() if not isinstance(v, list | dict)},
                     indent=1))
    print(f"wall={time.perf_counter() - t0:.0f}s cpu={time.process_time() - c0:.0f}s "
          f"simulated={r.sim_s / 3600:.1f}h")
    print(reference_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
