"""Decisions digest and CPU time of truncated workload-1 runs, one line per policy.

A pure speed change of the daemon, the estimators or the simulator must leave every
digest as it was: compare the output with benchmarks/results/sim_digests_6h.txt.

usage (from a checkout): python benchmarks/sim_digests.py [HOURS] [POLICY,...]
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import bench_sim_speed as bench  # noqa: E402

from malleable.policies.registry import POLICIES  # noqa: E402
from malleable.sim.traces import load_pollux_workload  # noqa: E402


def main() -> int:
    hours = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
    policies = sys.argv[2].split(",") if len(sys.argv) > 2 else list(POLICIES)
    logging.getLogger("malleable").setLevel(logging.ERROR)
    jobs = load_pollux_workload(ROOT / "malleable/sim/data/pollux/workloads/workload-1.csv")
    for policy in policies:
        c0 = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()):
            row = bench.one("workload-1", jobs, policy, max_time_s=hours * 3600)
        print(f"{policy:8s} {hours:g}h sha={row['sha']} cpu={time.process_time() - c0:6.1f}s",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
