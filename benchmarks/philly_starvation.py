"""Starvation promotion on the Philly window: requeues, queue and wall time, with and without.

Under sustained load every pending job eventually waits ``starve_s`` and is promoted
(`malleable.policies.starvation`); each decision then starts the longest-waiting one,
which takes a running job's GPUs. The policy's problem holds the running jobs and the
first ``queue_depth`` pending ones (`malleable.daemon.inputs.split_queue`); until
2026-12-07 the depth counted only jobs that never started, so every job this rotation
requeued stayed in the problem and set the simulator's cost per simulated minute.

usage (from a checkout):
    python benchmarks/philly_starvation.py [--hours 15] [--policy pollux]
        [--starve-s 3600,1e9]

Each ``--starve-s`` value is one run (the policy's ``starve_s`` parameter; 1e9 puts
promotion out of reach). Printed per run: requeues and admissions that reached DONE,
jobs finished, the others by state at the end (running, pending, held: by the daemon,
e.g. checkpointed to 0 GPUs or beyond the queue depth), the mean JCT of the finished
ones (biased to short jobs in a truncated run), decide cycles and wall time; then the
largest groups of held jobs by reason (the daemon's last target reason: the policy's
words for a job it considered at some time, Slurm's pending reason for one it never
did; a job requeued beyond the queue depth keeps the policy's last words). The runs
are not paired (`ab_speed.py`): their wall times are only as steady as the VM.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from machine import reference_line  # noqa: E402
from philly import DEFAULT_PATH, busiest_window  # noqa: E402

from malleable.config import parse_config  # noqa: E402
from malleable.policies.registry import get_policy  # noqa: E402
from malleable.sim.jobsetup import setup_for  # noqa: E402
from malleable.sim.loop import SimOptions, run_simulation  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=15.0, help="simulated hours per run")
    ap.add_argument("--policy", default="pollux")
    ap.add_argument("--starve-s", default="3600,1e9",
                    help="comma-separated starve_s values, one run each")
    ap.add_argument("--philly", default=DEFAULT_PATH)
    args = ap.parse_args()
    try:
        values = [float(v) for v in args.starve_s.split(",") if v]
    except ValueError:
        ap.error(f"--starve-s {args.starve_s!r}: expected numbers separated by commas")
    if args.hours <= 0 or not values or min(values) <= 0:
        ap.error(f"--hours {args.hours}, --starve-s {args.starve_s}: expected values > 0")
    for v in values:
        try:
            get_policy(args.policy, starve_s=v)
        except ValueError as exc:
            ap.error(f"--policy {args.policy} with starve_s {v:g}: {exc} "
                     f"(policies with starvation promotion: las, gittins, pollux)")
    logging.getLogger("malleable").setLevel(logging.ERROR)
    vc, start, window = busiest_window(args.philly)
    print(reference_line())
    print(f"# philly busiest fitting 2-week window: virtual cluster {vc}, from day "
          f"{start / 86400:.1f}, {len(window)} jobs; 16 nodes x 4 GPUs, {args.policy}, "
          f"first {args.hours:g} simulated hours", flush=True)
    for starve_s in values:
        config = parse_config({"policy": {"name": args.policy,
                                          "params": {"starve_s": starve_s}}}, source="bench")
        opts = SimOptions(nodes=16, gpus_per_node=4, restart_cost_s=30.0,
                          setup=setup_for(args.policy), max_time_s=args.hours * 3600)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            r = run_simulation(window, config, opts)
        wall = time.perf_counter() - t0
        actions = r.summary["actions"]
        left = Counter(u.state for u in r.unfinished)
        done = [o.jct_s for o in r.outcomes if o.end_s is not None and o.jct_s is not None]
        mean = sum(done) / len(done) if done else float("nan")
        print(f"starve_s={starve_s:<10g} requeues={actions.get('requeue:done', 0):5d} "
              f"admits={actions.get('admit:done', 0):5d} finished={len(done):5d} "
              f"at the end: running={left['running']:3d} pending={left['pending']:5d} "
              f"held={left['held']:5d} mean_jct_finished={mean:8.0f}s "
              f"decides={r.cycles.decides} wall={wall:6.1f}s", flush=True)
        held = [g for g in r.summary["unfinished_jobs"] if g["state"] == "held"]
        for g in held[:3]:
            print(f"    held {g['jobs']:5d}: {g['reason'][:100]}")
    print(reference_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
