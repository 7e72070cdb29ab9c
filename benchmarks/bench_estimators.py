"""Speed of the estimators: J jobs, S new progress samples each, one cycle.

    .venv/bin/python benchmarks/bench_estimators.py [--jobs 10000] [--samples 100] [--repeat 3]

Prints the sizes and the time of each stage of a cycle (`update`: fold the
samples into the state; `estimate`: fit every job's throughput model, power
law, noise scale and remaining work; `speedup_table`: goodput-optimal batch
and goodput over the candidate grid), for a cold cycle (empty state) and for
warm cycles (the steady state of the daemon: new samples on top of a state
and the previous fit). Goal (issue 6): a warm cycle with 10,000 jobs x 100
new samples in under 1 s on this 2-core machine.

For scale it also times scipy.optimize.least_squares on one job's table, the
per-job alternative, and extrapolates it to J jobs.

The synthetic jobs: random Pollux parameters around the cluster default;
each job runs at two configurations per cycle (it was resized halfway), one
sample every 30 s with 5 % log-normal noise on the iteration time, gradient
statistics on every sample and a validation metric on every tenth; a third
of the jobs declare a target metric, a third a sample target, a third none
(the remaining work then comes from a history of 5,000 finished jobs).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
from scipy.optimize import least_squares

from malleable.estimators import (
    EstimatorConfig,
    EstimatorState,
    JobSpecs,
    ProgressBatch,
    WorkHistory,
    candidate_grid,
    estimate,
    speedup_table,
    update,
)
from malleable.estimators.throughput import log_iteration_time

G = 4  # GPUs per node
TOTAL_GPUS = 256
INTERVAL_S = 30.0


def make_jobs(J: int, rng: np.random.Generator):
    m0 = rng.choice([32.0, 64.0, 128.0, 256.0], J)
    spec = JobSpecs(
        min_gpus=np.ones(J, np.int64), max_gpus=np.full(J, 64, np.int64),
        step=np.ones(J, np.int64), init_batch=m0, max_batch=m0 * 32,
        target_samples=np.where(np.arange(J) % 3 == 0, 5e7, np.nan),
        target_metric=np.where(np.arange(J) % 3 == 1, 0.9, np.nan),
        history_group=np.arange(J) % 7)
    tau = np.exp(rng.normal(np.log(0.2), 1.0, J))
    cd = EstimatorConfig().cluster
    u_true = cd.params(tau, m0).to_u() + rng.normal(0, 0.3, (J, 7))
    return spec, u_true


def make_batch(J: int, S: int, u_true: np.ndarray, spec: JobSpecs, cycle: int, state_last,
               rng: np.random.Generator) -> ProgressBatch:
    """S samples per job: the first half at one configuration, the second at another."""
    choices = np.array([1, 2, 4, 8, 16])
    k1 = choices[(np.arange(J) + cycle) % 5]
    k2 = choices[(np.arange(J) + cycle + 2) % 5]
    half = S // 2
    k = np.concatenate([np.repeat(k1[:, None], half, 1), np.repeat(k2[:, None], S - half, 1)], 1)
    n = np.where(k <= G, 1, k // G)
    m = spec.init_batch[:, None] * np.maximum(k // 2, 1)
    logt = log_iteration_time(u_true, k, n, m) + rng.normal(0, 0.05, (J, S))
    T = np.exp(logt)
    t0 = np.where(np.isfinite(state_last[:, 0]), state_last[:, 0], 0.0)
    s0 = np.where(np.isfinite(state_last[:, 2]), state_last[:, 2], 0.0)
    st0 = np.where(np.isfinite(state_last[:, 1]), state_last[:, 1], 0.0)
    dt = np.full((J, S), INTERVAL_S)
    dt[:, half] += 60.0  # the restart between the two configurations
    t = t0[:, None] + np.cumsum(dt, 1)
    dsteps = INTERVAL_S / T
    steps = st0[:, None] + np.cumsum(dsteps, 1)
    samples = s0[:, None] + np.cumsum(dsteps * m, 1)
    metric = np.where(np.arange(S)[None, :] % 10 == 9,
                      0.95 - 0.5 * (samples / 1e5) ** -0.4 + rng.normal(0, 0.002, (J, S)), np.nan)
    grad_sqr = np.exp(rng.normal(0, 0.3, (J, S)))
    grad_var = 50.0 * np.exp(rng.normal(0, 0.3, (J, S)))
    job = np.repeat(np.arange(J), S)
    return ProgressBatch(job=job, t=t.ravel(), step=steps.ravel(), samples=samples.ravel(),
                         gpus=k.ravel().astype(float), nodes=n.ravel().astype(float),
                         batch=m.ravel(), metric=metric.ravel(), grad_sqr=grad_sqr.ravel(),
                         grad_var=grad_var.ravel())


def timed(fn, *args, **kw):
    """(result, wall seconds, CPU seconds of this process)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0, time.process_time() - c0


def per_job_scipy(state: EstimatorState, rows: np.ndarray, m0: np.ndarray) -> float:
    """Seconds per job for scipy.optimize.least_squares on the same tables."""
    t0 = time.perf_counter()
    for j in rows:
        w = state.cfg_w[j]
        sel = w > 0
        k, n, m = state.cfg_k[j][sel][None], state.cfg_n[j][sel][None], state.cfg_m[j][sel][None]
        y = (state.cfg_s1[j][sel] / w[sel])[None]
        sw = np.sqrt(w[sel])

        def res(u, k=k, n=n, m=m, y=y, sw=sw):
            return np.concatenate([(log_iteration_time(u[None], k, n, m) - y)[0] * sw, u * 0.1])
        least_squares(res, np.full(7, -2.0))
    return (time.perf_counter() - t0) / len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3, help="warm cycles to time")
    args = ap.parse_args(argv)
    J, S = args.jobs, args.samples
    if J < 1 or S < 2 or args.repeat < 1:
        print("error: --jobs >= 1, --samples >= 2 and --repeat >= 1 are required",
              file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    config = EstimatorConfig()
    spec, u_true = make_jobs(J, rng)
    history = WorkHistory(np.exp(rng.normal(np.log(2e7), 1.0, 5000)), rng.integers(0, 7, 5000))
    k = candidate_grid(spec.max_gpus, G, TOTAL_GPUS)
    print(f"# bench_estimators: {J:,} jobs x {S} new samples = {J * S:,} samples per cycle; "
          f"candidate grid K = {len(k)} ({k.tolist()}); {config.max_configs} configurations "
          f"per job; {config.batch_candidates} batch candidates")
    print(f"# machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, numpy {np.__version__}; load average before the "
          f"run {os.getloadavg()[0]:.2f} (other processes share the cores)")
    state = EstimatorState.empty(J, config)
    rows = []
    for c in range(args.repeat + 1):
        batch = make_batch(J, S, u_true, spec, c, state.last, rng)
        state, t_up, c_up = timed(update, state, batch, spec, config)
        est, t_est, c_est = timed(estimate, state, spec, history=history, config=config)
        state = state.with_fit(est.u)
        table, t_tab, c_tab = timed(speedup_table, est, spec, k, G, config)
        total = t_up + t_est + t_tab
        label = "cold" if c == 0 else f"warm {c}"
        rows.append((label, t_up, t_est, t_tab, total, c_up + c_est + c_tab))
        assert np.all(np.isfinite(table.goodput)) and np.all(table.goodput >= 0)
    print(f"{'cycle':8s} {'update s':>9s} {'estimate s':>11s} {'table s':>8s} {'total s':>8s} "
          f"{'CPU s':>6s} {'samples/s':>12s}")
    for label, a, b, c_, tot, cpu in rows:
        print(f"{label:8s} {a:9.3f} {b:11.3f} {c_:8.3f} {tot:8.3f} {cpu:6.3f} "
              f"{J * S / tot:12,.0f}")
    warm = np.array([r[4] for r in rows[1:]])
    warm_cpu = np.array([r[5] for r in rows[1:]])
    print(f"warm cycle, median of {len(warm)}: {np.median(warm):.3f} s wall "
          f"({np.median(warm_cpu):.3f} s CPU; best {warm.min():.3f} s wall) for {J:,} jobs x {S} "
          f"samples: goal < 1 s {'met' if np.median(warm) < 1.0 else 'NOT met'} "
          f"({np.median(warm) / 1.0:.2f} of the budget)")
    sample_rows = rng.choice(J, size=min(J, 50), replace=False)
    per_job = per_job_scipy(state, sample_rows, spec.init_batch)
    print(f"per-job scipy.optimize.least_squares on the same tables: {per_job * 1e3:.1f} ms/job "
          f"-> {per_job * J:.1f} s for {J:,} jobs ({per_job * J / np.median(warm):.0f}x the "
          "batched warm cycle)")
    flags = table.flags
    print(f"jobs with a fitted model: {int(np.sum(~table.from_prior)):,}; remaining work from "
          f"target {int(np.sum(flags & 256 > 0)):,}, curve {int(np.sum(flags & 512 > 0)):,}, "
          f"history {int(np.sum(flags & 1024 > 0)):,}, default {int(np.sum(flags & 2048 > 0)):,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
