"""Paired speed comparison of two revisions on the same truncated simulation.

On a VM whose speed drifts by tens of percent within minutes, two benchmark runs made
at different times do not show a 10 % change. This runs one workload for a fixed
simulated time with the checkout and with another revision (a `git worktree` of it),
alternating (base, head, base, head, ...), each in a fresh process, and prints every
run's wall and CPU time, the decisions digest (a pure speed change keeps it), and the
ratio of the median CPU times.

usage (from a checkout):
    python benchmarks/ab_speed.py BASE_REV [--hours 15] [--pairs 3]
        [--workload philly|workload-1] [--policy default] [--philly PATH]

Pairs alternate their order (base then head, head then base, ...), so neither side
always runs first; the verdict is the median of the per-pair ratios. The base revision
needs ``bench_sim_speed.one`` with ``max_time_s`` and ``benchmarks/machine.py``
(2026-12-07 and later).

The Philly window is `bench_sim_speed`'s (the busiest 2-week window that fits 64 GPUs);
``--hours`` truncates it (the run stops at that simulated time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine import reference_line  # noqa: E402

# Run in the child, in the tree under test (its own malleable and bench_sim_speed).
CHILD = r"""
import contextlib, io, json, logging, sys, time
root, workload, policy, hours, philly = (sys.argv[1], sys.argv[2], sys.argv[3],
                                         float(sys.argv[4]), sys.argv[5])
sys.path[:0] = [root + "/benchmarks", root]
logging.getLogger("malleable").setLevel(logging.ERROR)
import bench_sim_speed as bench
from malleable.sim import traces, workloads as w
if workload == "philly":
    jobs = traces.load_philly(philly, seed=0,
                              min_duration_s=w.PHILLY_MIN_DURATION_S,
                              max_gpu_time_s=w.PHILLY_MAX_GPU_TIME_S)
    _, _, jobs = w.busiest_fitting_window(jobs, 14 * 86400.0, 64.0,
                                          demand=lambda j: w.isolated_demand(j, 4, 64))
else:
    jobs = traces.load_pollux_workload(
        f"{root}/malleable/sim/data/pollux/workloads/{workload}.csv")
c0 = time.process_time()
with contextlib.redirect_stdout(io.StringIO()):
    row = bench.one(workload, jobs, policy, max_time_s=hours * 3600)
print(json.dumps({"wall_s": row["wall_s"], "cpu_s": time.process_time() - c0,
                  "sha": row["sha"], "jobs": len(jobs), "sim_h": row["sim_h"]}))
"""


def run(tree: Path, args) -> dict:
    """One run in a fresh process; its JSON line as a dict. Raises SystemExit with the
    child's error output if it failed."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), args.workload, args.policy,
                          str(args.hours), args.philly], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the run in {tree} failed (exit {out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the revision to compare the checkout with (e.g. HEAD~1)")
    ap.add_argument("--hours", type=float, default=15.0, help="simulated hours per run")
    ap.add_argument("--pairs", type=int, default=3, help="(base, head) pairs to run")
    ap.add_argument("--workload", default="philly", help="philly or a bundled Pollux "
                    "workload's name (workload-1 ... workload-8)")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--philly", default="/work/shared/data/philly_pollux/philly.csv",
                    help="Philly job list (philly.csv)")
    args = ap.parse_args()
    if args.hours <= 0 or args.pairs < 1:
        ap.error(f"--hours {args.hours} and --pairs {args.pairs}: expected > 0 and >= 1")
    got = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "--verify",
                          args.base + "^{commit}"], capture_output=True, text=True)
    if got.returncode != 0:
        ap.error(f"base {args.base!r}: not a revision of {ROOT}")
    rev = got.stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          check=True, capture_output=True, text=True).stdout.strip()
    print(reference_line())
    print(f"# {args.workload}, policy {args.policy}, {args.hours:g} simulated hours per run; "
          f"base {rev}, head {head} (the checkout, with any uncommitted change)", flush=True)
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                        str(base), rev], check=True)
        try:
            for i in range(args.pairs):
                order = (("base", base), ("head", ROOT))
                for name, tree in order if i % 2 == 0 else order[::-1]:
                    r = run(tree, args)
                    runs[name].append(r)
                    print(f"pair {i + 1} {name} ({rev if name == 'base' else head}): "
                          f"wall {r['wall_s']:6.1f} s cpu {r['cpu_s']:6.1f} s "
                          f"jobs {r['jobs']} sim {r['sim_h']:.1f} h sha {r['sha'][:16]}",
                          flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(base)], check=False)
    ratios = [hr["cpu_s"] / br["cpu_s"] for br, hr in zip(runs["base"], runs["head"],
                                                             strict=True)]
    mid = statistics.median(ratios)
    print(f"head/base CPU per pair: {', '.join(f'{x:.3f}' for x in ratios)}; median {mid:.3f} "
          f"(spread {min(ratios):.3f} to {max(ratios):.3f}: a change smaller than the "
          f"spread is not shown)")
    shas = {r["sha"] for r in runs["base"] + runs["head"]}
    same = "the same in every run" if len(shas) == 1 else (
        "DIFFERENT: " + ", ".join(sorted(x[:16] for x in shas)))
    print(f"decisions digest: {same}")
    print(reference_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
