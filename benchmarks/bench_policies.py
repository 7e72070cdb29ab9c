"""Decision time of every policy at cluster scale.

For 100, 1,000 and 10,000 malleable jobs on 128, 1,024 and 8,192 GPUs (8 GPUs
per node, a quarter of the nodes partly taken by rigid jobs, about half the
jobs running), time one `Policy.allocate` call of each policy (median of
``--repeat`` calls, after one warm-up call) and print a table in
milliseconds, with the goals: under 50 ms at 1,000 jobs / 1,024 GPUs and
under 1 s at 10,000 jobs / 8,192 GPUs. Instances come from
`malleable.policies.synthetic.random_instance` (k^p and Amdahl curves, job
maximums 1..128 GPUs, log-normal work); Gittins gets 1,000 finished-job sizes.

Usage:
    python benchmarks/bench_policies.py [--repeat 5] [--out FILE]
"""

from __future__ import annotations

import argparse
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
GOALS = {(1_000, 1_024): 0.050, (10_000, 8_192): 1.0}


def time_call(fn, repeat: int) -> float:
    fn()  # warm-up (imports, caches)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the table to this file")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    names = [n for n in available() if n != "default"] + ["default", "default+hysteresis"]
    lines = [f"# python benchmarks/bench_policies.py {' '.join(sys.argv[1:] if argv is None else argv)}",
             f"# {platform.python_implementation()} {platform.python_version()}, numpy "
             f"{np.__version__}, {platform.machine()}; default = {DEFAULT}; "
             f"median of {args.repeat} calls, milliseconds",
             ""]
    header = f"{'policy':20s}" + "".join(f"{f'{j}j/{g}g':>14s}" for j in JOBS for g in GPUS)
    lines.append(header)
    print("\n".join(lines), flush=True)
    worst = {key: 0.0 for key in GOALS}
    cases = {}
    for J in JOBS:
        for gpus in GPUS:
            rng = np.random.default_rng(args.seed + J + gpus)
            jobs, cap = random_instance(rng, J, gpus // G, G,
                                        max_choices=(1, 2, 4, 8, 16, 32, 64, 128))
            ctx = Context(size_history=rng.lognormal(9.0, 1.8, size=1000))
            cases[J, gpus] = (jobs, cap, ctx)
    for name in names:
        if name == "default+hysteresis":
            policy = Hysteresis(get_policy("default"))
        else:
            policy = get_policy(name)
        row = f"{name:20s}"
        for J in JOBS:
            for gpus in GPUS:
                jobs, cap, ctx = cases[J, gpus]
                reps = args.repeat if J <= 1_000 else max(1, args.repeat // 2)
                dt = time_call(lambda: policy.allocate(jobs, cap, ctx), reps)  # noqa: B023
                if (J, gpus) in worst:
                    worst[J, gpus] = max(worst[J, gpus], dt)
                row += f"{dt * 1000:14.1f}"
        lines.append(row)
        print(row, flush=True)
    lines.append("")
    for (J, gpus), goal in GOALS.items():
        verdict = "met" if worst[J, gpus] < goal else "NOT met"
        lines.append(f"goal {J} jobs / {gpus} GPUs < {goal * 1000:.0f} ms: slowest "
                     f"{worst[J, gpus] * 1000:.1f} ms, {verdict} "
                     f"(ratio {worst[J, gpus] / goal:.2f} of the goal)")
    print("\n".join(lines[-len(GOALS):]))
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
