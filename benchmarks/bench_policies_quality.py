"""Which policy cuts mean JCT most: a small fluid simulation to choose `default`.

Not the project's simulator (malleable.sim replays traces through the
daemon); a compact model of the same situation, good enough to rank the
policies and to pick a default until the simulator revisits it:

* cluster: 16 nodes x 4 GPUs (Pollux's testbed shape), all free for malleable jobs;
* workload: 160 jobs arriving uniformly at random over 8 hours (Pollux's
  workload shape); each job's work, in one-GPU seconds, is a Philly job's
  GPU time (``/work/shared/data/philly_pollux/philly.csv``, filtered as
  Pollux does: duration >= 60 s, GPU time < 1000 h); its request is that
  job's GPU count; its speedup is Amdahl (serial fraction 1..15%) or k^p
  (p in 0.5..0.95), half each; maximum 4..32 GPUs; min 1, step 1;
* estimates: the policies see remaining work with a per-job log-normal error
  (sigma 0.5 at submission) that shrinks in proportion to the work done, and
  a standard deviation to match; Gittins sees the GPU time of 300 other Philly
  jobs plus the jobs finished so far;
* mechanics: a decision every 60 s; a job whose GPU count changes to k > 0
  makes no progress for its restart cost (30 s, as in Pollux's simulator);
  a finished job's GPUs idle until the next decision; when every job left
  runs at its maximum and none arrives, time jumps to the next completion
  (nothing is left to decide);
* policies: each registered policy raw, and behind the `Hysteresis` wrapper
  with the configuration defaults (min_gain 0.05, cool-down 300 s).

Printed per policy, averaged over the seeds: mean JCT, 99th percentile JCT,
mean restarts per job, makespan, and mean JCT relative to `static`.

Usage:
    python benchmarks/bench_policies_quality.py [--seeds 4] [--load 1.0] [--out FILE]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

from malleable.config import PolicyConfig
from malleable.estimators.table import SpeedupTable, candidate_grid, feasible_mask
from malleable.policies.base import Capacity, Context, JobSet
from malleable.policies.hysteresis import with_hysteresis
from malleable.policies.registry import DEFAULT, available, get_policy
from malleable.policies.synthetic import amdahl, power_law

PHILLY = Path("/work/shared/data/philly_pollux/philly.csv")
NODES, G = 16, 4
INTERVAL, DELTA = 60.0, 30.0


def philly_jobs(max_gpu_hours: float = 1000.0,
                path: Path = PHILLY) -> tuple[np.ndarray, np.ndarray]:
    """(gpu_time seconds, num_gpus) of Philly jobs, filtered as Pollux does
    (duration >= 60 s, GPU time < ``max_gpu_hours``)."""
    gt, ng = [], []
    with Path(path).open() as fh:
        for row in csv.DictReader(fh):
            d, g, t = float(row["duration"]), int(row["num_gpus"]), float(row["gpu_time"])
            if d >= 60 and t < max_gpu_hours * 3600:
                gt.append(t)
                ng.append(g)
    return np.asarray(gt), np.asarray(ng)


def workload(rng: np.random.Generator, gt: np.ndarray, ng: np.ndarray, n: int, load: float,
             sigma: float = 0.5):
    pick = rng.choice(len(gt), size=n, replace=False)
    arrive = np.sort(rng.uniform(0, 8 * 3600 / load, size=n))
    work = gt[pick]
    req = ng[pick]
    maxg = rng.choice([4, 8, 16, 32], size=n)
    amd = rng.random(n) < 0.5
    f = rng.uniform(0.01, 0.15, n)
    p = rng.uniform(0.5, 0.95, n)
    err = np.exp(rng.normal(0, 1.0, n) * sigma)
    history = gt[rng.choice(np.setdiff1d(np.arange(len(gt)), pick), size=300, replace=False)]
    return dict(arrive=arrive, work=work, req=np.minimum(req, maxg), maxg=maxg, amd=amd, f=f,
                p=p, err=err, history=history, sigma=sigma)


def simulate(policy, wl: dict, *, horizon: float = 30 * 86400.0) -> dict:
    n = len(wl["work"])
    cap = Capacity.uniform(NODES, G)
    k = candidate_grid(wl["maxg"], G, cap.total)
    sp = np.where(wl["amd"][:, None], amdahl(k, wl["f"]), power_law(k, wl["p"]))
    rate1 = np.ones(n)  # work is in one-GPU seconds
    gp = rate1[:, None] * sp
    mins, steps = np.ones(n, np.int64), np.ones(n, np.int64)
    mask = feasible_mask(k, mins, wl["maxg"], steps, G)
    batch = np.broadcast_to(k * 32, (n, len(k))).copy()
    top = k[np.max(np.where(mask & (k <= cap.total), np.arange(len(k)), 0), axis=1)]
    left = wl["work"].astype(float).copy()
    gpus = np.zeros(n, np.int64)
    attained = np.zeros(n)
    since = np.full(n, np.inf)
    restarts = np.zeros(n, np.int64)
    stall = np.zeros(n)        # seconds of restart delay still to serve
    finish = np.full(n, np.nan)
    hist = list(wl["history"])
    t = 0.0
    while t < horizon:
        active = np.flatnonzero((wl["arrive"] <= t) & np.isnan(finish))
        if len(active) == 0:
            if np.all(~np.isnan(finish)):
                break
            t = max(t + INTERVAL, float(wl["arrive"][np.isnan(finish)].min()))
            t = np.ceil(t / INTERVAL) * INTERVAL
            continue
        a = active
        done_frac = 1.0 - left[a] / wl["work"][a]
        est = left[a] * wl["err"][a] ** (1.0 - done_frac)
        table = SpeedupTable(k=k, feasible=mask[a], goodput=gp[a], batch=batch[a],
                             remaining_work=est,
                             remaining_std=wl["sigma"] * est * (1.0 - done_frac))
        jobs = JobSet(ids=np.array([str(i) for i in a], dtype=object), min_gpus=mins[a],
                      max_gpus=wl["maxg"][a], step=steps[a], current=gpus[a], table=table,
                      attained=attained[a], age=t - wl["arrive"][a],
                      restart_cost=np.full(len(a), DELTA), since_change=since[a],
                      requested=wl["req"][a], restarts=restarts[a])
        ctx = Context(now=t, size_history=np.asarray(hist))
        new = policy.allocate(jobs, cap, ctx).gpus
        changed = new != gpus[a]
        restarts[a] += changed & (gpus[a] > 0)
        stall[a] = np.where(changed & (new > 0), DELTA, np.where(changed, 0.0, stall[a]))
        since[a] = np.where(changed, 0.0, since[a])
        gpus[a] = new
        # advance one interval
        r = gp[a, np.searchsorted(k, new)]
        useful = np.maximum(INTERVAL - stall[a], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            need = np.where(r > 0, left[a] / r, np.inf)
        ends = need <= useful
        left[a] = np.where(ends, 0.0, left[a] - r * useful)
        attained[a] += new * np.where(ends, np.minimum(stall[a] + need, INTERVAL), INTERVAL)
        for i in a[ends]:
            finish[i] = t + stall[i] + need[np.searchsorted(a, i)]
            hist.append(attained[i])
            gpus[i] = 0
        stall[a] = np.maximum(stall[a] - INTERVAL, 0.0)
        since[a] += INTERVAL
        t += INTERVAL
        # Fast-forward: every job left is running at its maximum feasible size and no job
        # arrives before the next completion, so no policy has anything to decide: jump
        # whole intervals to the one before that completion.
        live = a[~ends]
        if len(live) and np.all(gpus[live] == top[live]) and not np.any(stall[live] > 0):
            rl = gp[live, np.searchsorted(k, gpus[live])]
            nxt = min(float(np.min(left[live] / rl)),
                      float(np.min(wl["arrive"][wl["arrive"] > t], initial=np.inf)) - t)
            skip = int(nxt // INTERVAL) - 1
            if skip > 0:
                left[live] -= rl * skip * INTERVAL
                attained[live] += gpus[live] * skip * INTERVAL
                since[live] += skip * INTERVAL
                t += skip * INTERVAL
    jct = finish - wl["arrive"]
    return dict(mean=float(np.nanmean(jct)), median=float(np.nanmedian(jct)),
                p99=float(np.nanpercentile(jct, 99)),
                unfinished=int(np.isnan(finish).sum()), restarts=float(restarts.mean()),
                makespan=float(np.nanmax(finish)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--load", type=float, default=1.0, help="arrival-rate multiplier")
    ap.add_argument("--jobs", type=int, default=160)
    ap.add_argument("--sigma", type=float, default=0.5,
                    help="log-normal error of the remaining-work estimate at submission")
    ap.add_argument("--max-gpu-hours", type=float, default=1000.0,
                    help="drop Philly jobs with more GPU time (Pollux: 1000)")
    ap.add_argument("--philly", default=str(PHILLY), help="Philly job list (Pollux's philly.csv)")
    ap.add_argument("--only", default="", help="comma-separated policy names (default: all)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    gt, ng = philly_jobs(args.max_gpu_hours, Path(args.philly))
    names = [nm for nm in available() if nm != "default"]
    if args.only:
        names = [nm for nm in names if nm in args.only.split(",") or nm == "static"]
    cfg = PolicyConfig()
    variants = [(nm, lambda nm=nm: get_policy(nm)) for nm in names] + [
        (f"{nm}+hyst", lambda nm=nm: with_hysteresis(get_policy(nm), cfg)) for nm in names]
    lines = [f"# python benchmarks/bench_policies_quality.py "
             f"{' '.join(sys.argv[1:] if argv is None else argv)}",
             f"# {NODES}x{G} GPUs, {args.jobs} Philly-sized jobs (< {args.max_gpu_hours:g} GPU-h) "
             f"over {8 / args.load:.1f} h, "
             f"{args.seeds} seeds; estimate error sigma {args.sigma}; "
             f"decisions every {INTERVAL:.0f} s; restart cost {DELTA:.0f} s; "
             f"current default = {DEFAULT}",
             "# hysteresis: min_gain 0.05, cool-down 300 s (PolicyConfig defaults)", ""]
    lines.append(f"{'policy':16s}{'mean JCT h':>12s}{'median h':>10s}{'p99 JCT h':>11s}"
                 f"{'restarts/job':>14s}"
                 f"{'makespan h':>12s}{'unfinished':>11s}{'vs static':>11s}{'sim s':>8s}")
    print("\n".join(lines), flush=True)
    wls = [workload(np.random.default_rng(s), gt, ng, args.jobs, args.load, args.sigma)
           for s in range(args.seeds)]
    results = {}
    for label, make in variants:
        t0 = time.perf_counter()
        runs = [simulate(make(), wl) for wl in wls]
        el = time.perf_counter() - t0
        results[label] = {key: float(np.mean([r[key] for r in runs])) for key in runs[0]}
        results[label]["wall"] = el
    base = results["static"]["mean"]
    rows = sorted(results.items(), key=lambda kv: kv[1]["mean"])
    for label, r in rows:
        line = (f"{label:16s}{r['mean'] / 3600:12.2f}{r['median'] / 3600:10.2f}"
                f"{r['p99'] / 3600:11.2f}{r['restarts']:14.2f}"
                f"{r['makespan'] / 3600:12.1f}{r['unfinished']:11.1f}{r['mean'] / base:11.2f}"
                f"{r['wall']:8.1f}")
        lines.append(line)
        print(line, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
