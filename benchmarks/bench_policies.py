"""Decision time of every policy at cluster scale.

For 100, 1,000 and 10,000 malleable jobs on 128, 1,024 and 8,192 GPUs (8 GPUs
per node, a quarter of the nodes partly taken by rigid jobs, about half the
jobs running), time one `Policy.allocate` call of each policy (median of
``--repeat`` calls, after one warm-up call; CPU and wall-clock time) and
print tables in milliseconds, with the goals: under 50 ms at 1,000 jobs / 1,024 GPUs and
under 1 s at 10,000 jobs / 8,192 GPUs. Instances come from
`malleable.policies.synthetic.random_instance` (k^p and Amdahl curves, job
maximums 1..128 GPUs, log-normal work); Gittins gets 1,000 finished-job sizes.

Usage:
    python benchmarks/bench_policies.py [--repeat 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

from malleable.policies.base import Context
from malleable.policies.hysteresis import Hysteresis
from malleable.policies.registry import DEFAULT, available, get_policy
from malleable.policies.synthetic import random_instance

JOBS = (100, 1_000, 10_000)
GPUS = (128, 1_024, 8_192)
G = 8
GOALS = {(1_000, 1_024): 0.050, (10_000, 8_192): 1.0}  # seconds


def time_call(fn, repeat: int) -> tuple[float, float]:
    """Median wall-clock and median CPU seconds of ``repeat`` calls (after a warm-up)."""
    fn()  # warm-up (imports, caches)
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the table to this file")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    names = [n for n in available() if n != "default"] + ["default", "default+hysteresis"]
    argv_s = " ".join(sys.argv[1:] if argv is None else argv)
    head = [f"# python benchmarks/bench_policies.py {argv_s}".rstrip(),
            f"# {platform.python_implementation()} {platform.python_version()}, numpy "
            f"{np.__version__}, {platform.machine()}, {os.cpu_count()} cores; "
            f"load average at start {os.getloadavg()[0]:.1f}; default = {DEFAULT}",
            f"# time of one allocate() call, median of {args.repeat} (10,000 jobs: "
            f"{max(1, args.repeat // 2)}), milliseconds; CPU = process time (what the call "
            f"costs), wall = elapsed (includes waiting for a core on a shared machine)", ""]
    print("\n".join(head), flush=True)
    cases = {}
    for J in JOBS:
        for gpus in GPUS:
            rng = np.random.default_rng(args.seed + J + gpus)
            jobs, cap = random_instance(rng, J, gpus // G, G,
                                        max_choices=(1, 2, 4, 8, 16, 32, 64, 128))
            ctx = Context(size_history=rng.lognormal(9.0, 1.8, size=1000))
            cases[J, gpus] = (jobs, cap, ctx)
    wall: dict[tuple[str, int, int], float] = {}
    cpu: dict[tuple[str, int, int], float] = {}
    for name in names:
        policy = Hysteresis(get_policy("default")) if name == "default+hysteresis" \
            else get_policy(name)
        for J in JOBS:
            for gpus in GPUS:
                jobs, cap, ctx = cases[J, gpus]
                reps = args.repeat if J <= 1_000 else max(1, args.repeat // 2)
                w, c = time_call(lambda: policy.allocate(jobs, cap, ctx), reps)  # noqa: B023
                wall[name, J, gpus], cpu[name, J, gpus] = w, c
        print(f"  {name} done", file=sys.stderr, flush=True)
    lines = list(head)
    for label, table in (("CPU ms", cpu), ("wall ms", wall)):
        lines.append(f"{label:20s}" + "".join(f"{f'{j}j/{g}g':>14s}" for j in JOBS for g in GPUS))
        for name in names:
            lines.append(f"{name:20s}" + "".join(f"{table[name, j, g] * 1000:14.1f}"
                                                 for j in JOBS for g in GPUS))
        lines.append("")
    for (J, gpus), goal in GOALS.items():
        for label, table in (("CPU", cpu), ("wall", wall)):
            worst_name = max(names, key=lambda n: table[n, J, gpus])  # noqa: B023
            worst = table[worst_name, J, gpus]
            lines.append(f"goal {J} jobs / {gpus} GPUs < {goal * 1000:.0f} ms ({label}): "
                         f"slowest {worst_name} {worst * 1000:.1f} ms = {worst / goal:.2f} of "
                         f"the goal, {'met' if worst < goal else 'NOT met'}")
    print("\n".join(lines[len(head):]))
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
